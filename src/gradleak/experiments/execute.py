"""Running an experiment: every cell of its grid through the single-run runner, each
finished input committed to the experiment's database, resuming what an earlier run of the
same experiment (or of another file declaring the same cells) finished."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gradleak import runner
from gradleak.data.sources import dataset_status
from gradleak.devices import resolve_device
from gradleak.distributed import backend_session
from gradleak.errors import GradleakError
from gradleak.experiments.database import CellStatus, ExperimentDatabase, cell_key
from gradleak.experiments.estimate import CellEstimate, estimate
from gradleak.experiments.grid import Cell, expand
from gradleak.experiments.published import Published, read_published
from gradleak.experiments.spec import ExperimentFile, read_experiment, utility_of
from gradleak.experiments.utility import UtilityProgress, measure_cells
from gradleak.models.registry import MODELS, model_status
from gradleak.models.sources import HF_PREFIX
from gradleak.record import Record
from gradleak.utility import UtilitySettings

DEFAULT_RUNS = Path("runs")


@dataclass(frozen=True)
class Experiment:
    """A validated experiment: its file, its cells in order, the published figures it
    compares with (None when it names none) and its utility fine-tuning (None: not asked)."""

    file: ExperimentFile
    cells: list[Cell]
    published: Published | None = None
    utility: UtilitySettings | None = None  # the fine-tuning that measures utility, if asked

    @property
    def name(self) -> str:
        return self.file.name

    def default_out(self) -> Path:
        """Where its results go unless told otherwise: ``runs/NAME``."""
        return DEFAULT_RUNS / self.name


def load_experiment(path: str | Path, data_dir: str | None = None) -> Experiment:
    """Read, expand and check an experiment file without running anything: unknown keys,
    invalid values, missing paths, models and data are one-line errors naming the file, the
    line and the key. ``data_dir``: the data folder of cells that do not set one."""
    file = read_experiment(path)
    cells = expand(file, data_dir)
    _check_available(file, cells)
    return Experiment(file, cells, published_of(file), utility_of(file))


def published_of(file: ExperimentFile) -> Published | None:
    """The published figures an experiment file names, read and checked."""
    if file.spec.published is None:
        return None
    return read_published(file.path.parent / file.spec.published)


def _check_available(file: ExperimentFile, cells: list[Cell]) -> None:
    """Every model and dataset the grid names can be loaded here (checked without loading)."""
    checked: set[tuple[str, str | None]] = set()
    for cell in cells:
        scenario = cell.config.scenario
        model = scenario.model
        if ("model", model) not in checked:
            checked.add(("model", model))
            problem = _model_problem(model)
            if problem:
                raise file.error(cell.sources.get("model", ()), problem)
        data = scenario.data
        if ("dataset", data.dataset + str(data.data_dir)) not in checked:
            checked.add(("dataset", data.dataset + str(data.data_dir)))
            try:
                status = dataset_status(data.dataset, data.data_dir)
            except GradleakError as exc:
                raise file.error(cell.sources.get("dataset", ()), str(exc)) from None
            if status.startswith("missing"):
                problem = status.removeprefix("missing: ")
                raise file.error(cell.sources.get("dataset", ()), f"{data.dataset}: {problem}")


def _model_problem(model: str) -> str | None:
    if model in MODELS:
        status = model_status(model)
        return f"{model} is {status}" if status.startswith("missing") else None
    if model.startswith(HF_PREFIX) or Path(model).expanduser().is_dir():
        return None
    return f"unknown model '{model}': use one of {', '.join(MODELS)}, a model folder or hf:ORG/NAME"


@dataclass(frozen=True)
class Plan:
    """What a run of the experiment would do now: each cell with its remaining cost."""

    cells: list[tuple[Cell, CellStatus | None, CellEstimate]]

    @property
    def remaining_inputs(self) -> int:
        return sum(e.remaining for _, _, e in self.cells)

    @property
    def seconds(self) -> float:
        return sum(e.seconds for _, _, e in self.cells)


def plan(experiment: Experiment, out: str | Path | None = None) -> Plan:
    """The experiment's cells, what ``out`` already holds of each, and the rest's cost."""
    folder = Path(out) if out is not None else experiment.default_out()
    statuses: dict[str, CellStatus] = {}
    if (folder / "results.sqlite").exists():
        with ExperimentDatabase(folder, create=False) as database:
            statuses = {s.key: s for s in database.statuses()}
    rows = []
    for cell in experiment.cells:
        status = statuses.get(cell_key(cell))
        rows.append((cell, status, estimate(cell.config, status)))
    return Plan(rows)


# (cell index, cells, inputs done in the grid, inputs in the grid, the cell's status line)
GridProgress = Callable[[int, int, int, int, str], None]


@dataclass
class ExperimentRun:
    """What a run of an experiment did: each cell's record (None for a cell left part-way
    by ``limit``) or the one-line error that stopped it."""

    folder: Path
    records: dict[str, Record | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    utility_errors: dict[str, str] = field(default_factory=dict)  # by scenario
    seconds: float = 0.0


def run_experiment(
    experiment: Experiment | str | Path,
    out: str | Path | None = None,
    *,
    workers: int = 1,
    device: torch.device | str = "cpu",
    limit: int | None = None,
    data_dir: str | None = None,
    stack: int | str = 1,
    backend: str = "processes",
    ray_address: str | None = None,
    progress: GridProgress | None = None,
    utility_progress: UtilityProgress | None = None,
) -> ExperimentRun:
    """Run every cell of ``experiment`` (a file, or one loaded by :func:`load_experiment`),
    keeping each finished input in ``out/results.sqlite`` (default ``runs/NAME``).

    Cells already finished there are not run again, and part-way cells resume. A cell whose
    run fails (a dataset too small for its inputs, an attack that cannot apply) is reported
    in the result's ``errors`` and the grid goes on. ``limit`` runs at most the first
    ``limit`` inputs of each cell. ``workers``, ``device``, ``stack``, ``backend``,
    ``ray_address``: as ``gradleak.run`` (one Ray instance serves the whole grid).

    An experiment with a ``utility:`` section then fine-tunes each distinct scenario of its
    grid once (not again on a re-run) and keeps its dev metrics beside the cells'."""
    started = time.perf_counter()
    if not isinstance(experiment, Experiment):
        experiment = load_experiment(experiment, data_dir)
    folder = Path(out) if out is not None else experiment.default_out()
    device = str(resolve_device(device))
    result = ExperimentRun(folder)
    with backend_session(backend, ray_address), ExperimentDatabase(folder) as database:
        database.set_meta("name", experiment.name)
        database.set_meta("experiment", experiment.file.path.read_text(encoding="utf-8"))
        database.set_meta("description", experiment.file.spec.description)
        if experiment.published is not None:
            database.set_meta("published", experiment.published.model_dump_json())
        for cell in experiment.cells:  # every planned cell, so a report shows what is to come
            database.cell_results(cell, device).start()
        run_cells(experiment.cells, database, result, workers=workers, device=device,
                  limit=limit, progress=progress, stack=stack, backend=backend,
                  ray_address=ray_address)  # fmt: skip
        if experiment.utility is not None:
            database.set_meta("utility", experiment.utility.model_dump_json())
            result.utility_errors = measure_cells(
                experiment.cells, experiment.utility, database, device, utility_progress
            )
    result.seconds = time.perf_counter() - started
    return result


def run_cells(
    cells: list[Cell],
    database: ExperimentDatabase,
    result: ExperimentRun,
    *,
    workers: int = 1,
    device: str = "cpu",
    limit: int | None = None,
    progress: GridProgress | None = None,
    stack: int | str = 1,
    backend: str = "processes",
    ray_address: str | None = None,
) -> None:
    """Run ``cells`` in order into ``database``, adding each one's record (or its error) to
    ``result``: the loop of :func:`run_experiment`, for callers that make their own cells."""
    wanted = [c.config.scenario.data.n_inputs for c in cells]
    total = sum(wanted if limit is None else [min(limit, n) for n in wanted])
    done_before = 0
    for index, cell in enumerate(cells):
        report = _cell_progress(progress, index, len(cells), done_before, total, cell)
        status = database.status(cell)
        if status is not None and status.finished:  # its record stands: nothing to load or redo
            result.records[cell.name] = database.record(status.key)
            counted = status.done if limit is None else min(status.done, limit)
            if report is not None:
                report(counted, counted, {})
            done_before += counted
            continue
        store = database.cell_results(cell, device)
        try:
            record = runner.run(cell.config, progress=report, workers=workers, device=device,
                                limit=limit, store=store, stack=stack, backend=backend,
                                ray_address=ray_address)  # fmt: skip
        except GradleakError as exc:
            result.errors[cell.name] = str(exc)
            continue
        finally:
            status = database.status(cell)
            done = 0 if status is None else status.done
            done_before += done if limit is None else min(done, limit)
        result.records[cell.name] = record if status and status.finished else None


def _cell_progress(
    progress: GridProgress | None, index: int, cells: int, before: int, total: int, cell: Cell
) -> runner.Progress | None:
    """The runner's per-input callback, reporting the grid's progress."""
    if progress is None:
        return None
    progress(index, cells, before, total, cell.name)
    return lambda done, _wanted, _sample: progress(index, cells, before + done, total, cell.name)
