"""What each cell's protocol and defenses cost the model, beside what they leak: an
experiment with a ``utility:`` section fine-tunes every distinct scenario of its grid once
(``gradleak utility``'s federated fine-tuning) and keeps the dev metrics in its database, so
a report can plot privacy against utility.

A scenario's utility does not depend on the attack, on how many inputs are attacked or on
what the server knows, so cells that differ only there share one measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gradleak.config import RunConfig
from gradleak.config.fine_tuning import UtilitySettings
from gradleak.errors import GradleakError
from gradleak.experiments.database import ExperimentDatabase, hashed_key
from gradleak.experiments.grid import Cell, canonical_json

# (scenarios done, scenarios, the scenario's name)
UtilityProgress = Callable[[int, int, str], None]

# what the fine-tuning reads of a scenario's data (not n_inputs, batch_size, lengths, label)
_DATA_FIELDS = ("dataset", "split", "encoding", "max_tokens", "chunk_tokens", "sample_seed")


def utility_identity(config: RunConfig, settings: UtilitySettings) -> dict[str, Any]:
    """What a scenario's utility depends on: the model, its training data, the protocol,
    the defenses, the seed, and the fine-tuning's settings."""
    identity = config.identity()
    scenario = identity["scenario"]
    return {
        "model": scenario["model"],
        "task": scenario["task"],
        "data": {k: scenario["data"].get(k) for k in _DATA_FIELDS},
        "protocol": scenario["protocol"],
        "defenses": scenario["defenses"],
        "seed": identity["seed"],
        "utility": settings.model_dump(mode="json"),
    }


def utility_key(config: RunConfig, settings: UtilitySettings) -> str:
    return hashed_key(canonical_json(utility_identity(config, settings)))


def scenario_name(cell: Cell) -> str:
    """A scenario named by its cell's labels less the attack's (``defense=sign``)."""
    named = [f"{k}={v}" for k, v in cell.labels.items() if k != "attack"]
    return ", ".join(named) or "the grid's scenario"


def measure_cells(
    cells: list[Cell],
    settings: UtilitySettings,
    database: ExperimentDatabase,
    device: str = "cpu",
    progress: UtilityProgress | None = None,
) -> dict[str, str]:
    """Fine-tune each distinct scenario of ``cells`` not yet measured in ``database``;
    return the one-line errors of those that could not be (by scenario name)."""
    scenarios: dict[str, Cell] = {}
    for cell in cells:
        scenarios.setdefault(utility_key(cell.config, settings), cell)
    errors: dict[str, str] = {}
    for done, cell in enumerate(scenarios.values()):
        name = scenario_name(cell)
        if progress is not None:
            progress(done, len(scenarios), name)
        try:
            stored_or_measured(database, cell.config, settings, device)
        except GradleakError as exc:
            errors[name] = str(exc)
    if progress is not None:
        progress(len(scenarios), len(scenarios), "")
    return errors


def stored_or_measured(
    database: ExperimentDatabase, config: RunConfig, settings: UtilitySettings, device: str = "cpu"
) -> dict[str, Any]:
    """The scenario's utility record: from ``database``, or measured now and kept there."""
    key = utility_key(config, settings)
    record = database.utility(key)
    if record is None:
        from gradleak.evaluation.utility import measure_utility, utility_record  # (torch)

        result = measure_utility(config, settings, device=device)
        record = utility_record(config, settings, result)
        database.store_utility(key, utility_identity(config, settings), record)
    return record
