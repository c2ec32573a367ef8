"""Benchmark cells: each is one gradleak run (its options, as ``gradleak attack`` takes them).

A suite is an experiment made in code: its cells run through the same runner and into the
same results database as ``gradleak run EXPERIMENT.yaml`` (``<out>/<suite>/results.sqlite``,
which ``gradleak report`` and ``gradleak export`` read). A suite resumes input by input, and
a cell another suite has already run (LAMP_cos on CoLA B=1 is in several tables) is copied,
not run again. Records that earlier versions of these benchmarks kept as files
(``<suite>/<cell>.json``, ``<cell>.json.partial.jsonl``) are taken into the database the
first time a suite meets them; the files stay as they were.

Long tables outlive one machine through ``benchmarks/kept/<suite>/``: ``run.py --keep`` writes
each cell's finished inputs there as text (``<cell>.json.partial.jsonl``, the format of an
interrupted ``gradleak attack --out`` run), and a suite run on a fresh checkout takes them in
before it attacks anything, so it resumes where the kept run stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from report import write_results

from gradleak import runner
from gradleak.config import RunConfig
from gradleak.errors import GradleakError
from gradleak.experiments.database import FILE_NAME, ExperimentDatabase
from gradleak.experiments.execute import ExperimentRun, run_cells
from gradleak.experiments.grid import Cell, named_cells
from gradleak.store import ResultStore

DATASETS = ("cola", "sst2", "rotten_tomatoes")
KEPT = Path(__file__).resolve().parent / "kept"  # finished inputs kept in the repository

NamedOptions = tuple[str, dict[str, Any]]  # (name, options of `gradleak attack`)


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
    named: list[NamedOptions],
    only: str | None = None,
    report: bool = False,
    limit: int | None = None,
    workers: int = 1,
    device: str = "cpu",
    description: str = "",
    stack: int | str = 1,
    keep: bool = False,
) -> None:
    """Run a suite's cells (those whose name contains ``only``, if given); write its table.

    ``report`` runs nothing: the table is rebuilt from what the database holds. The table
    always lists every cell of the suite that has results, so filling a suite a few cells at
    a time loses no rows. ``limit`` runs each cell's first ``limit`` inputs only; the cells
    stay part-way and resume later. ``workers`` attack that many inputs of a cell at once
    (see ``runner.run``); ``device`` is where they compute (each record names it); ``stack``
    inputs go to the attack at a time (``runner.run``'s, "auto" or a number). ``keep``
    writes every cell's finished inputs to ``KEPT`` afterwards (see the module's docstring)."""
    cells = named_cells(named)
    chosen = [c for c in cells if only is None or only in c.name]
    started = time.perf_counter()
    with ExperimentDatabase(out_dir / suite) as database:
        database.set_meta("name", suite)
        database.set_meta("description", description)
        for one in chosen:
            adopt_earlier_results(database, out_dir, one)
        ran = (
            []
            if report
            else [run_cell(database, one, limit, workers, device, stack) for one in chosen]
        )
        rows = [row for one in cells if (row := cell_row(database, one)) is not None]
        if keep:
            for path in keep_inputs(database, cells, KEPT / suite):
                print(f"kept {path}")
    wanted = {one.name: one.config.scenario.data.n_inputs for one in cells}
    part_way = sum(row["inputs"] < wanted[row["cell"]] for row in rows)
    notes = (
        f"{len(ran)} of {len(cells)} cells run now; {len(rows) - part_way} finished, "
        f"{part_way} part-way (see inputs), {len(cells) - len(rows)} not begun. s/batch is as "
        "measured by each run; the machine line below describes the process that wrote this "
        "table."
    )
    for path in write_results(out_dir, suite, rows, started, notes=notes):
        print(f"wrote {path}")


def run_cell(
    database: ExperimentDatabase,
    one: Cell,
    limit: int | None,
    workers: int,
    device: str,
    stack: int | str = 1,
) -> str:
    """Run one cell (nothing when it is finished) and print its row; return its name."""
    started = time.perf_counter()
    result = ExperimentRun(database.folder)
    run_cells([one], database, result, workers=workers, device=device, limit=limit, stack=stack)
    if one.name in result.errors:
        print(
            f"{one.name}: {result.errors[one.name]}{_kept_hint(database, one, device)}", flush=True
        )
    else:
        print(cell_row(database, one), f"({time.perf_counter() - started:.0f} s)", flush=True)
    return one.name


def _kept_hint(database: ExperimentDatabase, one: Cell, device: str) -> str:
    """Where a cell's stored inputs came from ``KEPT`` and ran on another device, a fresh
    ``--out`` adopts them again: say which file to move to start the cell afresh."""
    status = database.status(one)
    kept = _partial(KEPT / database.folder.name / f"{one.name}.json")
    if status is None or status.done == 0 or status.device == device or not kept.exists():
        return ""
    return (
        f" (its {status.done} inputs on {status.device} are kept in {kept}: a fresh --out"
        f" adopts them too; move that file away to run the cell afresh on {device})"
    )


def cell_row(database: ExperimentDatabase, one: Cell) -> dict[str, Any] | None:
    """The cell's line in its suite's table (scored over its finished inputs when it is
    part-way), or None when it has none."""
    status = database.status(one)
    if status is None or status.done == 0:
        return None
    record = database.record(status.key) if status.finished else None
    if record is not None:
        return _row(one.name, record.to_json())
    samples = list(database.samples(status.key).values())
    return _row(one.name, _summary(samples, status.device))


def _summary(samples: list[dict[str, Any]], device: str) -> dict[str, Any]:
    """Stored samples without a record (part-way, or adopted from kept inputs) summarized
    like a record; ``device`` is where the cell's stored inputs ran."""
    return {
        "device": device,
        "samples": samples,
        "metrics": runner.summarize(samples),
        "timing": {
            "attack_s": sum(s.get("attack_s") or 0.0 for s in samples),
            "update_s": sum(s.get("update_s") or 0.0 for s in samples),
        },
        "failed_inputs": [s["index"] for s in samples if "error" in s],
    }


# --- results kept before the database, or by another suite ---------------------------------

Found = tuple[list[dict[str, Any]], dict[str, Any] | None, str]  # samples, record, device


def adopt_earlier_results(database: ExperimentDatabase, out_dir: Path, one: Cell) -> None:
    """Give a cell the database holds nothing of what exists of it elsewhere: its own
    record or partial file from before the database, or else the same run in another
    suite's database or files (a finished one first, else the one that got furthest)."""
    status = database.status(one)
    if status is not None and status.done > 0:
        return
    found = (
        _own_files(database.folder, one)
        or _own_files(KEPT / database.folder.name, one)
        or _twin(database, out_dir, one)
    )
    if found is not None:
        samples, record, device = found
        database.cell_results(one, device).adopt(samples, record)


def keep_inputs(database: ExperimentDatabase, cells: list[Cell], folder: Path) -> list[Path]:
    """Write each cell's finished inputs to ``folder`` as an interrupted run's file (one
    JSON line per input, in index order), replacing what was kept of it before."""
    written = []
    for one in cells:
        status = database.status(one)
        if status is None or status.done == 0:
            continue
        store = ResultStore(folder / f"{one.name}.json", one.config.identity(), status.device)
        assert store.partial is not None
        store.partial.unlink(missing_ok=True)
        store.start()
        for sample in database.samples(status.key).values():
            store.append(sample)
        written.append(store.partial)
    return written


def _own_files(folder: Path, one: Cell) -> Found | None:
    """The cell's record, or its interrupted run, as files named after it."""
    path = folder / f"{one.name}.json"
    return _record_file(path, one.config) or _partial_file(_partial(path), one.config)


def _twin(database: ExperimentDatabase, out_dir: Path, one: Cell) -> Found | None:
    """The same run in another suite's database or files."""
    found: list[Found] = []
    for twin in other_suites(out_dir, database):
        status = twin.status(one)
        if status is not None and status.done > 0:
            record = twin.record(status.key) if status.finished else None
            samples = list(twin.samples(status.key).values())
            found.append((samples, record and record.to_json(), status.device))
    for path in sorted(out_dir.glob("*/*.json")):
        if path.parent.resolve() != database.folder.resolve():
            found.append(_record_file(path, one.config))
            found.append(_partial_file(_partial(path), one.config))
    hits = [f for f in found if f is not None]
    return max(hits, key=lambda f: (f[1] is not None, len(f[0])), default=None)


def other_suites(out_dir: Path, database: ExperimentDatabase) -> Iterator[ExperimentDatabase]:
    """Every other suite's results database under ``out_dir``, each open while it is used."""
    for other in sorted(out_dir.glob(f"*/{FILE_NAME}")):
        if other.parent.resolve() != database.folder.resolve():
            with ExperimentDatabase(other.parent, create=False) as twin:
                yield twin


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial.jsonl")


def _record_file(path: Path, config: RunConfig) -> Found | None:
    """A finished record of ``config`` at ``path``. Its public samples stand in for the
    stored ones, which a finished run's files no longer hold."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        same = RunConfig.identity_of(record["config"]) == config.identity()
    except (ValueError, KeyError, TypeError, GradleakError):  # a suite's table, not a record
        return None
    return (record["samples"], record, record.get("device", "cpu")) if same else None


def _partial_file(path: Path, config: RunConfig) -> Found | None:
    """The finished inputs of an interrupted run of ``config`` at ``path``."""
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as handle:
        header = json.loads(handle.readline() or "{}")
    device = header.get("device", "cpu")
    store = ResultStore(path.with_name(path.name.removesuffix(".partial.jsonl")),
                        config.identity(), device)  # fmt: skip
    try:
        samples = list(store.load_finished().values())
    except GradleakError:  # another config's run
        return None
    return (samples, None, device) if samples else None


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
        **_stacked(record["samples"]),
        **_epsilon(record["samples"]),
    }


def _stacked(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"stack": largest}`` of a cell whose inputs were optimized in stacks (s/batch is then
    each input's share of its stack's time), ``{}`` for one attacked one by one."""
    largest = max((s.get("stacked", 1) for s in samples), default=1)
    return {"stack": largest} if largest > 1 else {}


def _epsilon(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"epsilon": ...}`` of a DP-SGD cell (each client round's, from its privacy facts;
    None without noise), ``{}`` for a cell without DP-SGD."""
    for sample in samples:
        privacy = (sample.get("info") or {}).get("privacy")
        if privacy:
            return {"epsilon": privacy.get("epsilon")}
    return {}
