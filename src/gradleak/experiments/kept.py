"""Results an experiment takes in from outside its database before it attacks anything, and
finished inputs it keeps outside it.

A **kept folder** (an experiment file's ``kept:``) holds each cell's finished inputs as text,
named after the cell: ``CELL.json.partial.jsonl``, the file of an interrupted ``gradleak
attack --out CELL.json`` run (a header line with the config's identity and the device, then
one finished input a line), or ``CELL.json``, a finished run's record. Kept in a repository,
it lets a table too long for one machine resume on a fresh checkout: a run adopts each file
whose config is its cell's, and ``gradleak run --keep`` writes every cell's finished inputs
back (replacing what was kept of it).

A cell that **another experiment** beside this one (another results folder in the same parent
folder, as ``runs/NAME`` are) has run with the same config is copied from there rather than
attacked again. Of everything found, a finished run is taken first, else the one that got
furthest.

Only cells the database holds nothing of adopt anything, and each adoption is one transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradleak.config import RunConfig
from gradleak.errors import GradleakError
from gradleak.experiments.database import FILE_NAME, CellStatus, ExperimentDatabase, cell_key
from gradleak.experiments.grid import Cell
from gradleak.running.store import ResultStore

PARTIAL_SUFFIX = ".partial.jsonl"


@dataclass(frozen=True)
class Found:
    """A cell's results found outside its database: its finished samples (stored form), its
    record when it finished, the device they ran on, and where they were found."""

    samples: list[dict[str, Any]]
    record: dict[str, Any] | None
    device: str
    source: Path

    def status(self, cell: Cell) -> CellStatus:
        """What the database will hold of ``cell`` once it adopts these."""
        return CellStatus(
            key=cell_key(cell),
            name=cell.name,
            labels=cell.labels,
            wanted=cell.config.scenario.data.n_inputs,
            done=len(self.samples),
            failed=sum("error" in s for s in self.samples),
            attack_s=sum(s.get("attack_s") or 0.0 for s in self.samples),
            device=self.device,
            finished=self.record is not None,
        )


def kept_file(folder: Path, cell: Cell) -> Path:
    """Where a kept folder holds ``cell``'s finished inputs."""
    return folder / f"{cell.name}.json{PARTIAL_SUFFIX}"


def kept_results(folder: Path, cell: Cell) -> Found | None:
    """``cell``'s record or finished inputs in a kept folder (files of another config under
    its name are not its results)."""
    record = folder / f"{cell.name}.json"
    return _record_file(record, cell.config) or _partial_file(kept_file(folder, cell), cell.config)


def earlier_results(
    cells: list[Cell], database: ExperimentDatabase | None, kept: Path | None, beside: Path
) -> dict[str, Found]:
    """What exists elsewhere of each cell ``database`` holds nothing of (by cell name): in the
    kept folder or in another experiment's results folder under ``beside``, a finished run
    first, else the one that got furthest (the kept folder's on a tie). Reads only."""
    missing = [c for c in cells if _empty(database, c)]
    found: dict[str, Found] = {}
    for cell in missing:
        hit = kept_results(kept, cell) if kept is not None else None
        if hit is not None:
            found[cell.name] = hit
    own = None if database is None else database.folder.resolve()
    for other in other_databases(beside, own) if missing else ():
        for cell in missing:
            hit = _twin(other, cell)
            best = found.get(cell.name)
            if hit is not None and (best is None or _rank(hit) > _rank(best)):
                found[cell.name] = hit
    return found


def adopt_earlier(
    database: ExperimentDatabase, cells: list[Cell], kept: Path | None
) -> dict[str, Path]:
    """Take into ``database`` what :func:`earlier_results` finds beside it; return where each
    adopted cell came from (by cell name)."""
    found = earlier_results(cells, database, kept, database.folder.parent)
    by_name = {cell.name: cell for cell in cells}
    for name, hit in found.items():
        database.cell_results(by_name[name], hit.device).adopt(hit.samples, hit.record)
    return {name: hit.source for name, hit in found.items()}


def keep_inputs(database: ExperimentDatabase, cells: list[Cell], folder: Path) -> list[Path]:
    """Write each cell's finished inputs to ``folder`` as an interrupted run's file (the
    header, then one JSON line per input in index order), replacing what was kept of it."""
    written = []
    for cell in cells:
        status = database.status(cell)
        if status is None or status.done == 0:
            continue
        store = ResultStore(folder / f"{cell.name}.json", cell.config.identity(), status.device)
        assert store.partial is not None
        store.partial.unlink(missing_ok=True)
        store.start()
        for sample in database.samples(status.key).values():
            store.append(sample)
        written.append(store.partial)
    return written


def kept_hint(database: ExperimentDatabase, cell: Cell, kept: Path | None, device: str) -> str:
    """For a cell stopped because its stored inputs ran on another device, when they came
    from the kept folder (which a fresh results folder adopts again): which file to move to
    run it afresh on ``device``; else ``""``."""
    status = database.status(cell)
    if kept is None or status is None or status.done == 0 or status.device == device:
        return ""
    path = kept_file(kept, cell)
    if not path.exists():
        return ""
    return (
        f" (its {status.done} inputs on {status.device} are kept in {path}: a fresh --out "
        f"adopts them too; move that file away to run the cell afresh on {device})"
    )


def _empty(database: ExperimentDatabase | None, cell: Cell) -> bool:
    if database is None:
        return True
    status = database.status(cell)
    return status is None or status.done == 0


def _rank(found: Found) -> tuple[bool, int]:
    return found.record is not None, len(found.samples)


@contextmanager
def _opened(folder: Path) -> Iterator[ExperimentDatabase | None]:
    """Another results folder's database, or None where it is not one this version reads."""
    try:
        database = ExperimentDatabase(folder, create=False)
    except (GradleakError, sqlite3.Error):
        yield None
        return
    try:
        yield database
    finally:
        database.close()


def other_databases(beside: Path, own: Path | None) -> Iterator[ExperimentDatabase]:
    """Every other experiment's results database in ``beside``, each open while it is used."""
    if not beside.is_dir():
        return
    for path in sorted(beside.glob(f"*/{FILE_NAME}")):
        if path.parent.resolve() == own:
            continue
        with _opened(path.parent) as other:
            if other is not None:
                yield other


def _twin(other: ExperimentDatabase, cell: Cell) -> Found | None:
    """The same run in another experiment's database."""
    try:
        status = other.status(cell)
        if status is None or status.done == 0:
            return None
        record = other.record(status.key) if status.finished else None
        samples = list(other.samples(status.key).values())
    except (GradleakError, sqlite3.Error):  # busy, or not readable: run the cell here instead
        return None
    return Found(samples, record and record.to_json(), status.device, other.folder)


def _record_file(path: Path, config: RunConfig) -> Found | None:
    """A finished record of ``config`` at ``path``. Its public samples stand in for the
    stored ones, which a finished run's files no longer hold."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        same = RunConfig.identity_of(record["config"]) == config.identity()
    except (ValueError, KeyError, TypeError, GradleakError):  # not a record
        return None
    if not same:
        return None
    return Found(record["samples"], record, record.get("device", "cpu"), path)


def _partial_file(path: Path, config: RunConfig) -> Found | None:
    """The finished inputs of an interrupted run of ``config`` at ``path``."""
    if not path.is_file():
        return None
    try:
        with path.open(encoding="utf-8") as handle:
            header = json.loads(handle.readline() or "{}")
        device = header.get("device", "cpu")
        out = path.with_name(path.name.removesuffix(PARTIAL_SUFFIX))
        samples = list(ResultStore(out, config.identity(), device).load_finished().values())
    except (ValueError, AttributeError, GradleakError):  # another config's run, or not one
        return None
    return Found(samples, None, device, path) if samples else None
