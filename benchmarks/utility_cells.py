"""Utility cells: what a suite's defenses cost the model (``gradleak utility``: federated
fine-tuning with the same client code and defense, then dev metrics), one per defense setting.

A cell's record is kept in the suite's results database (``<out>/<suite>/results.sqlite``,
its utility table: what ``gradleak run`` keeps for an experiment's ``utility:`` section), keyed
by what the fine-tuning depends on, so a finished cell is read back instead of run again and
another suite's same fine-tuning is copied. Records earlier versions kept as
``<suite>/utility/<label>.json`` are taken in the first time they are met.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from cells import other_suites
from report import write_results

from gradleak.config import RunConfig
from gradleak.experiments.database import ExperimentDatabase
from gradleak.experiments.utility import stored_or_measured, utility_identity, utility_key
from gradleak.options import utility_from_options
from gradleak.utility import UtilitySettings

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
    with ExperimentDatabase(out_dir / suite) as database:
        for label, options in cells:
            config, settings = utility_from_options(options)
            key = utility_key(config, settings)
            record = database.utility(key) or _earlier(out_dir, database, config, settings)
            if record is not None:
                database.store_utility(key, utility_identity(config, settings), record)
            elif not report:
                begun = time.perf_counter()
                record = stored_or_measured(database, config, settings)
                final = record["metrics"][-1]
                print(f"utility {label}: {final} ({time.perf_counter() - begun:.0f} s)")
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


def _earlier(
    out_dir: Path, database: ExperimentDatabase, config: RunConfig, settings: UtilitySettings
) -> dict[str, Any] | None:
    """The same fine-tuning in another suite's database, or in a record file of before."""
    key = utility_key(config, settings)
    for twin in other_suites(out_dir, database):
        if (record := twin.utility(key)) is not None:
            return record
    for path in sorted(out_dir.glob("*/utility/*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        stored = RunConfig.model_validate(record["config"], context={"stored": True})
        if utility_key(stored, UtilitySettings(**record["utility"])) == key:
            return record
    return None
