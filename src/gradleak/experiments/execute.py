"""Running an experiment: every cell of its grid through the single-run runner, each
finished input committed to the experiment's database, resuming what an earlier run of the
same experiment (or of another file declaring the same cells) finished. Before anything is
attacked, cells the database holds nothing of take in their kept inputs (the file's
``kept:`` folder) or the same run from another experiment beside it
(:mod:`gradleak.experiments.kept`)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradleak.config.fine_tuning import UtilitySettings
from gradleak.data.sources import dataset_status
from gradleak.errors import GradleakError
from gradleak.experiments.database import CellStatus, ExperimentDatabase, cell_key
from gradleak.experiments.estimate import CellEstimate, estimate
from gradleak.experiments.grid import Cell, expand
from gradleak.experiments.kept import adopt_earlier, earlier_results, keep_inputs, kept_hint
from gradleak.experiments.published import Published, read_published
from gradleak.experiments.spec import ExperimentFile, read_experiment, utility_of
from gradleak.experiments.utility import UtilityProgress, measure_cells
from gradleak.models.sources import HF_PREFIX
from gradleak.models.specs import MODELS, model_status
from gradleak.running.record import Record

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

    @property
    def kept(self) -> Path | None:
        """The folder of its cells' kept inputs (the file's ``kept:``), if it names one."""
        return self.file.kept

    def default_out(self) -> Path:
        """Where its results go unless told otherwise: ``runs/NAME``."""
        return DEFAULT_RUNS / self.name

    def chosen(self, only: str | None) -> list[Cell]:
        """Its cells whose name contains ``only`` (all of them without it)."""
        if only is None:
            return self.cells
        chosen = [cell for cell in self.cells if only in cell.name]
        if not chosen:
            names = ", ".join(cell.name for cell in self.cells)
            raise GradleakError(f"no cell of {self.name} has '{only}' in its name (cells: {names})")
        return chosen


def load_experiment(
    path: str | Path, data_dir: str | None = None, overrides: Mapping[str, Any] | None = None
) -> Experiment:
    """Read, expand and check an experiment file without running anything.

    Args:
        path: The experiment file (YAML).
        data_dir: The data folder of cells that do not set one.
        overrides: Options set in every cell over the file's values (``gradleak run
            --set KEY=VALUE``); cells they make the same are one cell.

    Returns:
        The :class:`Experiment`: the file, its grid of cells, the published figures it names
        and its ``utility:`` settings.

    Raises:
        ExperimentError: Unknown keys, invalid values, missing paths, models and data, as one
            line naming the file, the line and the key.
    """
    file = read_experiment(path)
    cells = expand(file, data_dir, overrides)
    _check_available(file, cells)
    return Experiment(file, cells, published_of(file), utility_of(file))


def published_of(file: ExperimentFile) -> Published | None:
    """The published figures an experiment file names, read and checked."""
    if file.spec.published is None:
        return None
    return read_published(file.folder_of(("published",)) / file.spec.published)


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


def plan(experiment: Experiment, out: str | Path | None = None, only: str | None = None) -> Plan:
    """The experiment's cells (those whose name contains ``only``), what ``out`` already holds
    of each or would take in first (kept inputs, another experiment's same run), and the
    rest's cost."""
    folder = Path(out) if out is not None else experiment.default_out()
    cells = experiment.chosen(only)
    statuses: dict[str, CellStatus] = {}
    if (folder / "results.sqlite").exists():
        with ExperimentDatabase(folder, create=False) as database:
            statuses = {s.key: s for s in database.statuses()}
    missing = [c for c in cells if statuses.get(cell_key(c)) is None]
    for name, found in earlier_results(missing, None, experiment.kept, folder.parent).items():
        cell = next(c for c in missing if c.name == name)
        statuses[cell_key(cell)] = found.status(cell)
    rows = []
    for cell in cells:
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
    adopted: dict[str, Path] = field(default_factory=dict)  # cells taken in, and from where
    kept: list[Path] = field(default_factory=list)  # the files ``keep`` wrote
    # chosen cells whose inputs ran on different code (runtime.revision; "not recorded" for
    # inputs stored before inputs recorded it): each version and its inputs
    mixed_code: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0


def run_experiment(
    experiment: Experiment | str | Path,
    out: str | Path | None = None,
    *,
    workers: int | None = None,
    device: str = "cpu",
    limit: int | None = None,
    data_dir: str | None = None,
    stack: int | str | None = None,
    backend: str = "processes",
    ray_address: str | None = None,
    progress: GridProgress | None = None,
    utility_progress: UtilityProgress | None = None,
    only: str | None = None,
    keep: bool = False,
    threads: int | None = None,
    on_plan: Callable[[str, Any], None] | None = None,
) -> ExperimentRun:
    """Run every cell of an experiment, keeping each finished input in
    ``out/results.sqlite``: ``gradleak run``.

    Cells already finished there are not run again, and part-way cells resume. A cell the
    folder holds nothing of first takes in its kept inputs (the file's ``kept:`` folder) or
    the same run from another results folder beside ``out``
    (:mod:`gradleak.experiments.kept`). A cell whose run fails (a dataset too small for its
    inputs, an attack that cannot apply) is reported in the result's ``errors`` and the grid
    goes on. An experiment with a ``utility:``
    section then fine-tunes each distinct scenario of the cells it ran once (not again on a
    re-run) and keeps its dev metrics beside the cells'.

    Args:
        experiment: A file, or one loaded by :func:`load_experiment`.
        out: The results folder (default ``runs/NAME``).
        workers: As ``gradleak.attack``.
        device: As ``gradleak.attack``.
        limit: Run at most the first ``limit`` inputs of each cell.
        data_dir: The data folder of cells that do not set one, when ``experiment`` is a
            file.
        stack: As ``gradleak.attack``.
        backend: As ``gradleak.attack`` (one Ray instance serves the whole grid).
        ray_address: As ``gradleak.attack``.
        progress: Called as each cell advances: (cell index, cells, inputs done in the
            grid, inputs in the grid, the cell's status line).
        utility_progress: Called as the ``utility:`` fine-tunings advance.
        only: Run only the cells whose name contains this.
        keep: Then write every cell's finished inputs to the file's ``kept:`` folder
            (replacing what was kept of each).
        threads: As ``gradleak.attack``: each process's torch threads (None: planned).
        on_plan: Called with each cell's name and its run plan before its inputs are
            attacked.

    Returns:
        The :class:`ExperimentRun`: the folder, each cell's record (None for a cell left
        part-way by ``limit``) or the one-line error that stopped it, and the time taken.

    Raises:
        ExperimentError: A bad experiment file (see :func:`load_experiment`).
        GradleakError: A results folder that cannot be used, a backend that cannot start,
            an ``only`` no cell's name contains, or ``keep`` without a ``kept:`` folder.
    """
    started = time.perf_counter()
    if not isinstance(experiment, Experiment):
        experiment = load_experiment(experiment, data_dir)
    chosen = experiment.chosen(only)
    if keep and experiment.kept is None:
        raise GradleakError(
            f"{experiment.file.path}: --keep needs a folder to keep the inputs in: add "
            "`kept: FOLDER` to the file"
        )
    from gradleak.running.distributed import backend_session  # the run engine (torch)
    from gradleak.runtime.devices import resolve_device

    folder = Path(out) if out is not None else experiment.default_out()
    device = str(resolve_device(device))
    result = ExperimentRun(folder)
    with backend_session(backend, ray_address), ExperimentDatabase(folder) as database:
        database.set_meta("name", experiment.name)
        database.set_meta("experiment", experiment.file.text)
        database.set_meta("description", experiment.file.spec.description)
        if experiment.published is not None:
            database.set_meta("published", experiment.published.model_dump_json())
        for cell in experiment.cells:  # every planned cell, so a report shows what is to come
            database.cell_results(cell, device).start()
        result.adopted = adopt_earlier(database, experiment.cells, experiment.kept)
        run_cells(chosen, database, result, workers=workers, device=device, limit=limit,
                  progress=progress, stack=stack, backend=backend, threads=threads,
                  on_plan=on_plan,
                  ray_address=ray_address)  # fmt: skip
        for cell in chosen:
            if cell.name in result.errors:
                result.errors[cell.name] += kept_hint(database, cell, experiment.kept, device)
            versions = code_versions(database, cell)
            if len(versions) > 1:
                result.mixed_code[cell.name] = versions
        if experiment.utility is not None:
            database.set_meta("utility", experiment.utility.model_dump_json())
            result.utility_errors = measure_cells(
                chosen, experiment.utility, database, device, utility_progress
            )
        if keep:
            assert experiment.kept is not None
            result.kept = keep_inputs(database, experiment.cells, experiment.kept)
    result.seconds = time.perf_counter() - started
    return result


def run_cells(
    cells: list[Cell],
    database: ExperimentDatabase,
    result: ExperimentRun,
    *,
    workers: int | None = None,
    device: str = "cpu",
    limit: int | None = None,
    progress: GridProgress | None = None,
    stack: int | str | None = None,
    backend: str = "processes",
    ray_address: str | None = None,
    threads: int | None = None,
    on_plan: Callable[[str, Any], None] | None = None,
) -> None:
    """Run ``cells`` in order into ``database``, adding each one's record (or its error) to
    ``result``: the loop of :func:`run_experiment`, for callers that make their own cells."""
    from gradleak.running import runner  # the run engine (torch): loaded when cells run

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
        heard = None if on_plan is None else (lambda plan, name=cell.name: on_plan(name, plan))
        try:
            record = runner.run(cell.config, progress=report, workers=workers, device=device,
                                limit=limit, store=store, stack=stack, backend=backend,
                                threads=threads, on_plan=heard,
                                ray_address=ray_address)  # fmt: skip
        except GradleakError as exc:
            result.errors[cell.name] = str(exc)
            continue
        finally:
            status = database.status(cell)
            done = 0 if status is None else status.done
            done_before += done if limit is None else min(done, limit)
        result.records[cell.name] = record if status and status.finished else None


def code_versions(database: ExperimentDatabase, cell: Cell) -> dict[str, int]:
    """The code each of a cell's stored inputs ran (its sample's ``code``; "not recorded"
    where an input was stored before inputs recorded it) and how many inputs ran it."""
    status = database.status(cell)
    if status is None:
        return {}
    samples = database.samples(status.key).values()
    return dict(Counter(sample.get("code") or "not recorded" for sample in samples))


def _cell_progress(
    progress: GridProgress | None, index: int, cells: int, before: int, total: int, cell: Cell
) -> Callable[[int, int, dict[str, Any]], None] | None:
    """The runner's per-input callback, reporting the grid's progress."""
    if progress is None:
        return None
    progress(index, cells, before, total, cell.name)
    return lambda done, _wanted, _sample: progress(index, cells, before + done, total, cell.name)
