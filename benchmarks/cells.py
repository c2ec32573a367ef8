"""Benchmark cells: each is one gradleak run (a RunConfig), stored and resumed like any run.

A cell's record goes to ``<out>/<suite>/<cell>.json``; an interrupted suite resumes where it
stopped, cell by cell and, inside a cell, input by input.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from report import write_results

from gradleak import experiment
from gradleak.config import validate_config

DATASETS = ("cola", "sst2", "rotten_tomatoes")

Cell = tuple[str, dict[str, Any]]  # (name, RunConfig fields)


def cell(
    model: str,
    dataset: str,
    batch_size: int,
    batches: int,
    data_dir: str | None,
    **fields: Any,
) -> dict[str, Any]:
    """The RunConfig fields of one cell: ``batches`` inputs of ``batch_size`` in LAMP's order."""
    return {
        "model": model,
        "dataset": dataset,
        "data_dir": data_dir,
        "n_inputs": batches,
        "batch_size": batch_size,
        **fields,
    }


def run_suite(out_dir: Path, suite: str, cells: list[Cell], only: str | None = None) -> None:
    """Run a suite's cells (those whose name contains ``only``, if given); write its table."""
    cells = [c for c in cells if only is None or only in c[0]]
    started = time.perf_counter()
    rows = run_cells(out_dir, suite, cells)
    for path in write_results(out_dir, suite, rows, started, notes=f"{len(cells)} cells."):
        print(f"wrote {path}")


def run_cells(
    out_dir: Path, suite: str, cells: list[tuple[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Run every cell (skipping finished ones) and return one summary row per cell."""
    rows = []
    for name, fields in cells:
        path = out_dir / suite / f"{name}.json"
        started = time.perf_counter()
        config = validate_config(**fields)
        record = _finished(path, config.model_dump(mode="json"))
        if record is None:
            record = experiment.run(config, out=str(path))
        strict = record["metrics"].get("strict", {})
        paper = record["metrics"].get("paper", {})
        n = max(1, len(record["samples"]))
        rows.append(
            {
                "cell": name,
                "R-1 strict": strict.get("rouge1", 0.0),
                "R-2 strict": strict.get("rouge2", 0.0),
                "exact %": strict.get("exact_match", 0.0),
                "R-1 paper": paper.get("rouge1", 0.0),
                "R-2 paper": paper.get("rouge2", 0.0),
                "s/batch": record["timing"]["attack_s"] / n,
                "failed": len(record["failed_inputs"]),
            }
        )
        print(rows[-1], f"({time.perf_counter() - started:.0f} s)", flush=True)
    return rows


def _finished(path: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The cell's record if an earlier run of the same config completed it."""
    if not path.exists():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    return record if record.get("config") == config else None
