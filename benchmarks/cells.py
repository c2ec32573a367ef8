"""Benchmark cells: each is one gradleak run (its options, as ``gradleak attack`` takes them),
stored and resumed like any run.

A cell's record goes to ``<out>/<suite>/<cell>.json``; an interrupted suite resumes where it
stopped, cell by cell and, inside a cell, input by input.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from report import write_results

from gradleak import runner
from gradleak.config import RunConfig
from gradleak.options import config_from_options
from gradleak.store import ResultStore

DATASETS = ("cola", "sst2", "rotten_tomatoes")

Cell = tuple[str, dict[str, Any]]  # (name, options of `gradleak attack`)


def cell(
    model: str,
    dataset: str,
    batch_size: int,
    batches: int,
    data_dir: str | None,
    **options: Any,
) -> dict[str, Any]:
    """The options of one cell: ``batches`` inputs of ``batch_size`` in LAMP's order."""
    return {
        "model": model,
        "dataset": dataset,
        "data_dir": data_dir,
        "n_inputs": batches,
        "batch_size": batch_size,
        **options,
    }


def run_suite(
    out_dir: Path,
    suite: str,
    cells: list[Cell],
    only: str | None = None,
    report: bool = False,
    limit: int | None = None,
    workers: int = 1,
    device: str = "cpu",
) -> None:
    """Run a suite's cells (those whose name contains ``only``, if given); write its table.

    ``report`` runs nothing: the table is rebuilt from the cells already finished (those
    matching ``only``). A run with ``only`` still writes the whole table: the cells it skipped
    show their stored results, so filling a suite a few cells at a time loses no rows. ``limit``
    runs each cell's first ``limit`` inputs only; the cells stay part-way and resume later.
    ``workers`` attack that many inputs of a cell at once (see ``runner.run``); ``device`` is
    where they compute (each record names it)."""
    chosen = [c for c in cells if only is None or only in c[0]]
    started = time.perf_counter()
    if report:
        rows = finished_rows(out_dir, suite, chosen)
        wanted = {name: fields["n_inputs"] for name, fields in chosen}
        partial = sum(row["inputs"] < wanted[row["cell"]] for row in rows)
        notes = (
            f"Rebuilt from stored results: {len(rows) - partial} of {len(chosen)} cells "
            f"finished, {partial} part-way (see inputs). s/batch is as measured by each run; the "
            "machine line below describes the process that wrote this table."
        )
    else:
        ran = {
            row["cell"]: row for row in run_cells(out_dir, suite, chosen, limit, workers, device)
        }
        skipped = [c for c in cells if c[0] not in ran]
        stored = {row["cell"]: row for row in finished_rows(out_dir, suite, skipped)}
        known = stored | ran
        rows = [known[name] for name, _ in cells if name in known]  # in the suite's order
        notes = f"{len(ran)} of {len(cells)} cells run now" + (
            f", at most the first {limit} inputs of each so far (see inputs)" if limit else ""
        )
        if stored:
            notes += f"; {len(stored)} more from stored results, as they were"
        notes += "."
    for path in write_results(out_dir, suite, rows, started, notes=notes):
        print(f"wrote {path}")


def finished_rows(out_dir: Path, suite: str, cells: list[Cell]) -> list[dict[str, Any]]:
    """Summary rows of the cells whose records are complete for their current config, and of
    cells interrupted part-way (their ``inputs`` column says how many are done)."""
    rows = []
    for name, fields in cells:
        config = config_from_options(fields)
        path = out_dir / suite / f"{name}.json"
        path = _twin(out_dir, path, config) or path
        record = _finished(path, config)
        if record is None:
            record = _unfinished(path, config)
        if record is not None:
            rows.append(_row(name, record))
    return rows


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial.jsonl")


def _twin(out_dir: Path, path: Path, config: RunConfig) -> Path | None:
    """Another suite's run of the same config, for a cell that has none of its own (LAMP_cos
    on CoLA B=1 is a cell of the main table, the ablation and the dropout table): the path of
    its finished record, or else of its interrupted run."""
    if path.exists() or _partial(path).exists():
        return None
    for other in sorted(out_dir.glob("*/*.json")):
        if other != path and _finished(other, config) is not None:
            return other
    for other in sorted(out_dir.glob("*/*.json.partial.jsonl")):
        with other.open(encoding="utf-8") as handle:
            header = json.loads(handle.readline() or "{}")
        if header.get("config") == config.identity():
            return other.with_name(other.name.removesuffix(".partial.jsonl"))
    return None


def _adopt(out_dir: Path, path: Path, config: RunConfig) -> None:
    """Start a new cell from its twin's record, or resume from the inputs its twin finished."""
    twin = _twin(out_dir, path, config)
    if twin is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if twin.exists() and _finished(twin, config) is not None:
        shutil.copyfile(twin, path)
    else:
        shutil.copyfile(_partial(twin), _partial(path))


def _unfinished(path: Path, config: RunConfig) -> dict[str, Any] | None:
    """What an interrupted run of ``config`` has finished, summarized like a record."""
    samples = list(ResultStore(path, config.identity()).load_finished().values())
    if not samples:
        return None
    return {
        "samples": samples,
        "metrics": runner.summarize(samples),
        "timing": {"attack_s": sum(s["attack_s"] for s in samples)},
        "failed_inputs": [s["index"] for s in samples if "error" in s],
    }


def run_cells(
    out_dir: Path,
    suite: str,
    cells: list[Cell],
    limit: int | None = None,
    workers: int = 1,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """Run every cell (skipping finished ones; at most ``limit`` inputs of each) and return
    one summary row per cell."""
    rows = []
    for name, fields in cells:
        path = out_dir / suite / f"{name}.json"
        started = time.perf_counter()
        config = config_from_options(fields)
        _adopt(out_dir, path, config)
        record = _finished(path, config)
        if record is None:
            run = runner.run(config, out=str(path), limit=limit, workers=workers, device=device)
            record = run.to_json()
        rows.append(_row(name, record))
        print(rows[-1], f"({time.perf_counter() - started:.0f} s)", flush=True)
    return rows


def _row(name: str, record: dict[str, Any]) -> dict[str, Any]:
    """A cell's line in its suite's table."""
    strict = record["metrics"].get("strict", {})
    paper = record["metrics"].get("paper", {})
    n = max(1, len(record["samples"]))
    return {
        "cell": name,
        "inputs": len(record["samples"]),
        "R-1 strict": strict.get("rouge1", 0.0),
        "R-2 strict": strict.get("rouge2", 0.0),
        "exact %": strict.get("exact_match", 0.0),
        "R-1 paper": paper.get("rouge1", 0.0),
        "R-2 paper": paper.get("rouge2", 0.0),
        "s/batch": record["timing"]["attack_s"] / n,
        "update s/batch": record["timing"].get("update_s", 0.0) / n,
        "peak MB": max((s.get("peak_rss_mb") or 0 for s in record["samples"]), default=0) or None,
        "failed": len(record["failed_inputs"]),
        "device": record.get("device", "cpu"),
        **_epsilon(record["samples"]),
    }


def _epsilon(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"epsilon": ...}`` of a DP-SGD cell (each client round's, from its privacy facts;
    None without noise), ``{}`` for a cell without DP-SGD."""
    for sample in samples:
        privacy = (sample.get("info") or {}).get("privacy")
        if privacy:
            return {"epsilon": privacy.get("epsilon")}
    return {}


def _finished(path: Path, config: RunConfig) -> dict[str, Any] | None:
    """The cell's record if an earlier run of the same config completed it (wherever its data
    folder was: a run's identity leaves it out)."""
    if not path.exists():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    stored = RunConfig.identity_of(record.get("config", {}))
    same = _without_unset(stored) == _without_unset(config.identity())
    return record if same else None


def _without_unset(value: Any) -> Any:
    """A config without its None (default) entries: an option added after a record was
    written, left at its default, does not make the record stale."""
    if isinstance(value, dict):
        return {k: _without_unset(v) for k, v in value.items() if v is not None}
    return value
