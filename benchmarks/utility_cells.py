"""Utility cells: what a suite's defenses cost the model (``gradleak utility``: federated
fine-tuning with the same client code and defense, then dev metrics), one per defense setting.

A cell's record goes to ``<out>/<suite>/utility/<label>.json``; a finished cell whose config
and fine-tuning settings are unchanged is read back instead of run again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from report import write_results

from gradleak.config import RunConfig
from gradleak.options import utility_from_options
from gradleak.utility import measure_utility, utility_record

UtilityCell = tuple[str, dict[str, Any]]  # (label, options of `gradleak utility`)


def utility_cell(
    model: str, dataset: str, data_dir: str | None, defense: str, **options: Any
) -> dict[str, Any]:
    """The options of one fine-tuning under ``defense``."""
    return {"model": model, "dataset": dataset, "data_dir": data_dir, "defense": defense,
            **options}  # fmt: skip


def run_utility(out_dir: Path, suite: str, cells: list[UtilityCell], report: bool = False) -> None:
    """Run (or, with ``report``, only read back) each utility cell; write
    ``<suite>_utility.json`` and ``.md``: dev metrics before and after fine-tuning."""
    started = time.perf_counter()
    rows = []
    for label, options in cells:
        config, settings = utility_from_options(options)
        path = out_dir / suite / "utility" / f"{label}.json"
        identity, fine_tuning = config.identity(), settings.model_dump(mode="json")
        record = _finished(path, identity, fine_tuning)
        for twin in sorted(out_dir.glob("*/utility/*.json")):  # another suite's same cell
            record = record or _finished(twin, identity, fine_tuning)
        if record is None and not report:
            begun = time.perf_counter()
            result = measure_utility(config, settings)
            record = utility_record(config, settings, result)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
            print(f"utility {label}: {result.final} ({time.perf_counter() - begun:.0f} s)")
        if record is not None:
            rows.append(utility_row(label, options["defense"], record))
    settings_note = ""
    if cells:
        _, settings = utility_from_options(cells[0][1])
        settings_note = (
            f" Fine-tuning: {settings.rounds} rounds of {settings.clients} clients with "
            f"{settings.samples} examples each; dev: {settings.eval_examples} examples of "
            f"the {settings.eval_split} split."
        )
    notes = f"{len(rows)} of {len(cells)} utility cells finished.{settings_note}"
    for path in write_results(out_dir, f"{suite}_utility", rows, started, notes=notes):
        print(f"wrote {path}")


def utility_row(label: str, defense: str, record: dict[str, Any]) -> dict[str, Any]:
    """A utility cell's line: dev metrics of the untrained and the fine-tuned model."""
    before, after = record["metrics"][0], record["metrics"][-1]
    row: dict[str, Any] = {"defense": label, "spec": defense}
    for metric, value in after.items():
        row[metric] = value
        row[f"{metric} before"] = before[metric]
    row["s"] = record["seconds"]
    return row


def _finished(path: Path, identity: dict[str, Any], settings: dict[str, Any]) -> dict | None:
    if not path.exists():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    same = RunConfig.identity_of(record["config"]) == identity and record["utility"] == settings
    return record if same else None
