"""What a report shows, read from an experiment's results folder: each cell's scores (over
its finished inputs, when it is part-way), its samples, its scenario, and the published
figures it is compared with."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradleak.config import RunConfig
from gradleak.config.fine_tuning import UtilitySettings
from gradleak.experiments.database import CellStatus, ExperimentDatabase
from gradleak.experiments.published import Figure, Published
from gradleak.experiments.utility import utility_key
from gradleak.running.record import Metrics, Record, public_sample, summarize


@dataclass(frozen=True)
class Utility:
    """A scenario's dev metrics before fine-tuning and after it (``experiments.utility``)."""

    task: str
    before: dict[str, float]
    after: dict[str, float]
    seconds: float
    key: str = ""  # the scenario's: cells that share it share the measurement

    @property
    def metric(self) -> str:
        """The one figure a privacy-utility plot shows: accuracy, or perplexity for LMs."""
        return "perplexity" if "perplexity" in self.after else "accuracy"


@dataclass(frozen=True)
class CellReport:
    """One cell: its name and labels, config, how far it got, its scores and samples."""

    name: str
    labels: dict[str, Any]
    config: RunConfig
    done: int
    wanted: int
    failed: int
    metrics: Metrics
    samples: list[dict[str, Any]]  # public samples (``record.public_sample``), by index
    scenario: str
    attack_s: float
    update_s: float
    device: str
    record: Record | None  # None while part-way
    figures: list[Figure] = field(default_factory=list)
    utility: Utility | None = None  # what the cell's scenario costs the model, if measured

    @property
    def finished(self) -> bool:
        return self.record is not None


@dataclass(frozen=True)
class ReportData:
    """Everything a report of one experiment shows."""

    name: str
    description: str
    folder: Path
    cells: list[CellReport]
    published: Published | None
    experiment_text: str

    @property
    def missing(self) -> list[str]:
        """What is not finished, in words (empty when every cell is)."""
        return [f"{c.name}: {c.done} of {c.wanted} inputs" for c in self.cells if not c.finished]

    @property
    def utilities(self) -> dict[str, Utility]:
        """Each measured scenario's utility, named by its cells' labels less the attack."""
        groups: dict[str, tuple[Utility, list[CellReport]]] = {}
        for cell in self.cells:
            if cell.utility is not None:
                groups.setdefault(cell.utility.key, (cell.utility, []))[1].append(cell)
        named: dict[str, Utility] = {}
        for utility, cells in groups.values():
            shared = [(k, v) for k, v in cells[0].labels.items()
                      if k != "attack" and all(c.labels.get(k) == v for c in cells)]  # fmt: skip
            named[", ".join(f"{k}={v}" for k, v in shared) or "the grid's scenario"] = utility
        return named

    @property
    def machines(self) -> list[dict[str, Any]]:
        """The machines and versions the finished cells ran with (each once)."""
        seen: dict[str, dict[str, Any]] = {}
        for cell in self.cells:
            record = cell.record
            if record is not None:
                about = {"machine": record.machine, "versions": record.versions,
                         "threads": record.torch_threads, "device": record.device}  # fmt: skip
                seen.setdefault(json.dumps(about, sort_keys=True), about)
        return list(seen.values())


def read_report_data(folder: str | Path) -> ReportData:
    """A results folder as a report's data. Cells that are part-way are scored over the
    inputs they finished; a folder with no cells yet gives an empty report."""
    folder = Path(folder)
    with ExperimentDatabase(folder, create=False) as database:
        published_text = database.meta("published")
        published = None if not published_text else Published.model_validate_json(published_text)
        settings_text = database.meta("utility")
        settings = None if not settings_text else UtilitySettings.model_validate_json(settings_text)
        cells = [_cell(database, status, published, settings) for status in database.statuses()]
        name = database.meta("name") or folder.name
        text = database.meta("experiment") or ""
        description = database.meta("description") or ""
    return ReportData(name, description, folder, cells, published, text)


def _cell(
    database: ExperimentDatabase,
    status: CellStatus,
    published: Published | None,
    settings: UtilitySettings | None,
) -> CellReport:
    config = RunConfig.model_validate(json.loads(database.cell_config(status.key)),
                                      context={"stored": True})  # fmt: skip
    record = database.record(status.key) if status.finished else None
    if record is not None:
        samples = [s.model_dump(mode="json") for s in record.samples]
        metrics, scenario = record.metrics, record.scenario.text
    else:
        stored = database.samples(status.key)
        samples = [public_sample(stored[i]) for i in sorted(stored)]
        scored = [stored[i] for i in sorted(stored)]
        metrics = Metrics.model_validate(summarize(scored))
        scenario = "(part-way: the scenario's description comes with the finished record)"
    return CellReport(
        name=status.name,
        labels=status.labels,
        config=config,
        done=status.done,
        wanted=status.wanted,
        failed=status.failed,
        metrics=metrics,
        samples=samples,
        scenario=scenario,
        attack_s=status.attack_s,
        update_s=sum(s.get("update_s") or 0.0 for s in samples),
        device=status.device,
        record=record,
        figures=published.for_cell(config) if published else [],
        utility=_utility(database, config, settings),
    )


def _utility(
    database: ExperimentDatabase, config: RunConfig, settings: UtilitySettings | None
) -> Utility | None:
    if settings is None:
        return None
    key = utility_key(config, settings)
    record = database.utility(key)
    if record is None:
        return None
    metrics = record["metrics"]
    return Utility(record["task"], metrics[0], metrics[-1], record["seconds"], key)
