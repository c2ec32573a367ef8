"""An experiment's results in one SQLite file: a row per finished input, committed as it
finishes, and each cell's record once all its inputs are done.

The file is opened in WAL mode with a generous busy timeout, and every write is one short
transaction, so a run killed at any moment loses at most the input in flight, and two
processes running the same experiment (or one running while a report reads) do not corrupt
it: an input both happen to finish is stored once (the first to commit wins; the same seed
gives the same result). Cells are keyed by their config's identity, as single runs' records
are, so a cell keeps its results when the file that declares it is edited around it, and
when a later gradleak adds an option (opening the file re-derives every key from the config
it stored, as a single run's store re-reads its header).

A reader (``create=False``: a report, ``gradleak export``, a plan) opens the file read-only
and never writes, so a results folder that is read-only, or one a run is writing, reads as
it is; it finds the cells of an older layout under today's keys in memory, and only a writer
stores them under those keys.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradleak.config import RunConfig
from gradleak.errors import GradleakError
from gradleak.experiments.grid import Cell, canonical_json, identity_key
from gradleak.running.record import Record
from gradleak.runtime.files import read_only_sqlite

FILE_NAME = "results.sqlite"
SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cells (
    key TEXT PRIMARY KEY,          -- sha256 of the identity
    name TEXT NOT NULL,
    identity TEXT NOT NULL,        -- the config's identity, canonical JSON
    config TEXT NOT NULL,          -- the config as run (its data folder included)
    labels TEXT NOT NULL,          -- the axis values that name the cell, JSON
    wanted INTEGER NOT NULL,       -- inputs the cell attacks
    device TEXT NOT NULL,
    started REAL NOT NULL,
    finished REAL,
    record TEXT                    -- the finished record, JSON (NULL while part-way)
);
CREATE TABLE IF NOT EXISTS samples (
    cell TEXT NOT NULL REFERENCES cells(key),
    idx INTEGER NOT NULL,
    sample TEXT NOT NULL,          -- the stored sample, JSON
    written REAL NOT NULL,
    PRIMARY KEY (cell, idx)
);
CREATE TABLE IF NOT EXISTS utility (
    key TEXT PRIMARY KEY,          -- sha256 of the scenario's utility identity
    identity TEXT NOT NULL,        -- what the fine-tuning depended on, canonical JSON
    record TEXT NOT NULL,          -- `gradleak utility --out`'s record, JSON
    written REAL NOT NULL
);
"""


@dataclass(frozen=True)
class CellStatus:
    """What the database holds of one cell."""

    key: str
    name: str
    labels: dict[str, Any]
    wanted: int
    done: int
    failed: int
    attack_s: float  # summed over its finished inputs
    device: str
    finished: bool


class ExperimentDatabase:
    """The results of one experiment, in ``folder/results.sqlite``: created and written
    (``create=True``), or an existing one read, never written (``create=False``)."""

    def __init__(self, folder: str | Path, create: bool = True) -> None:
        self.folder = Path(folder)
        self.path = self.folder / FILE_NAME
        self.read_only = not create
        # a reader's view of an older layout: today's key -> the stored one, and stored keys
        # a writer would drop (the same cell stored under both keys)
        self._stored_keys: dict[str, str] = {}
        self._dropped: set[str] = set()
        self._has_utility = True
        if not self.path.exists() and not create:
            raise GradleakError(
                f"{self.folder} holds no experiment results ({FILE_NAME}): give the folder a "
                "`gradleak run` wrote (its --out)"
            )
        if create:
            self._open_to_write()
        else:
            self._open_to_read()
        try:
            version = self.meta("schema")
            if version != str(SCHEMA_VERSION):
                raise GradleakError(
                    f"{self.path} was written by another gradleak (results schema {version}, "
                    f"this one reads {SCHEMA_VERSION}): use that version or a new --out"
                )
            self._rekey()
        except BaseException:
            self._connection.close()
            raise

    def _open_to_read(self) -> None:
        try:
            self._connection = read_only_sqlite(self.path)
            tables = {row[0] for row in self._connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}  # fmt: skip
        except sqlite3.Error as exc:
            raise GradleakError(
                f"cannot read {self.path} as a results database ({exc}): give the folder a "
                "`gradleak run` wrote (its --out)"
            ) from None
        if not {"meta", "cells", "samples"} <= tables:
            self._connection.close()
            raise GradleakError(
                f"{self.folder} holds no experiment results ({self.path} lacks their tables): "
                "give the folder a `gradleak run` wrote (its --out)"
            )
        self._has_utility = "utility" in tables  # a file from before utility was measured

    def _open_to_write(self) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._connection = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=NORMAL")
            self._connection.execute("PRAGMA busy_timeout=60000")
            with self._write() as db:
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                version_row = (str(SCHEMA_VERSION),)
                db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", version_row)
        except (OSError, sqlite3.Error) as exc:
            raise GradleakError(
                f"cannot use {self.path} as a results database ({exc}): choose a folder you "
                "can write (--out), or move away a file that is not one"
            ) from None

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> ExperimentDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (``BEGIN IMMEDIATE``) so that two writers
        queue instead of failing on a lock upgrade."""
        if self.read_only:
            raise GradleakError(f"{self.path} was opened to read (create=False): open it to write")
        db = self._connection
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _rekey(self) -> None:
        """Key every cell by its stored config's identity as this gradleak derives it: an
        option added since the cell ran takes its default, and the cell keeps its results
        (a config no longer readable keeps its old key: nothing will ask for it). A reader
        changes nothing: it only finds those cells under today's keys."""
        rows = self._connection.execute("SELECT key, config FROM cells").fetchall()
        moves = {}
        for key, config in rows:
            try:
                stored = RunConfig.model_validate(json.loads(config), context={"stored": True})
                identity = identity_key(stored)
            except (ValueError, GradleakError):
                continue
            if hashed_key(identity) != key:
                moves[key] = (hashed_key(identity), identity)
        if not moves:
            return
        if self.read_only:
            taken = {key for key, _ in rows}
            for old, (new, _) in moves.items():  # as the writer below would move them
                if new in taken:
                    self._dropped.add(old)
                else:
                    self._stored_keys[new] = old
                    taken.add(new)
            return
        with self._write() as db:
            for old, (new, identity) in moves.items():
                taken = db.execute("SELECT 1 FROM cells WHERE key = ?", (new,)).fetchone()
                if taken:  # the same run stored under both keys: keep the one already current
                    db.execute("DELETE FROM samples WHERE cell = ?", (old,))
                    db.execute("DELETE FROM cells WHERE key = ?", (old,))
                    continue
                db.execute("UPDATE cells SET key = ?, identity = ? WHERE key = ?",
                           (new, identity, old))  # fmt: skip
                db.execute("UPDATE samples SET cell = ? WHERE cell = ?", (new, old))

    # --- the experiment ----------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        row = self._connection.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # --- cells ---------------------------------------------------------------------------

    def cell_results(self, cell: Cell, device: str) -> CellResults:
        """The store a run of ``cell`` on ``device`` reads and writes (``runner.run``'s)."""
        return CellResults(self, cell, device)

    def statuses(self, key: str | None = None) -> list[CellStatus]:
        """Every cell the database has seen (or the one keyed ``key``), in the order they
        were first run."""
        rows = self._connection.execute(
            """SELECT c.key, c.name, c.labels, c.wanted, c.device, c.record IS NOT NULL,
                      COUNT(s.idx),
                      COALESCE(SUM(json_extract(s.sample, '$.error') IS NOT NULL), 0),
                      COALESCE(SUM(json_extract(s.sample, '$.attack_s')), 0.0)
               FROM cells c LEFT JOIN samples s ON s.cell = c.key
               WHERE ? IS NULL OR c.key = ?
               GROUP BY c.key ORDER BY c.started, c.rowid""",
            (self._stored(key), self._stored(key)),
        ).fetchall()
        today = {stored: key for key, stored in self._stored_keys.items()}
        return [
            CellStatus(today.get(key, key), name, json.loads(labels), wanted, done, failed,
                       attack_s, device, bool(finished))
            for key, name, labels, wanted, device, finished, done, failed, attack_s in rows
            if key not in self._dropped
        ]  # fmt: skip

    def _stored(self, key: str | None) -> str | None:
        """The key a cell is stored under (a reader of an older layout: not today's)."""
        return None if key is None else self._stored_keys.get(key, key)

    def status(self, cell: Cell) -> CellStatus | None:
        found = self.statuses(cell_key(cell))
        return found[0] if found else None

    def record(self, name_or_key: str) -> Record | None:
        """A finished cell's record (by name or key): the shape ``gradleak attack --out``
        writes. None while the cell is part-way."""
        rows = self._connection.execute(
            "SELECT key, record FROM cells WHERE key = ? OR name = ? ORDER BY started DESC",
            (self._stored(name_or_key), name_or_key),
        ).fetchall()
        row = next((row[1:] for row in rows if row[0] not in self._dropped), None)
        if row is None:
            known = ", ".join(s.name for s in self.statuses()) or "none yet"
            raise GradleakError(f"no cell {name_or_key} in {self.path} (cells: {known})")
        if row[0] is None:
            return None
        return Record.model_validate(json.loads(row[0]), context={"stored": True})

    def cell_config(self, key: str) -> str:
        """A cell's config as it ran, JSON."""
        row = self._connection.execute(
            "SELECT config FROM cells WHERE key = ?", (self._stored(key),)
        ).fetchone()
        if row is None:
            raise GradleakError(f"no cell {key} in {self.path}")
        return row[0]

    def samples(self, key: str) -> dict[int, dict[str, Any]]:
        rows = self._connection.execute(
            "SELECT idx, sample FROM samples WHERE cell = ? ORDER BY idx", (self._stored(key),)
        ).fetchall()
        return {idx: json.loads(sample) for idx, sample in rows}

    # --- utility ---------------------------------------------------------------------------

    def utility(self, key: str) -> dict[str, Any] | None:
        """A scenario's utility record (``experiments.utility``), None until measured."""
        if not self._has_utility:
            return None
        row = self._connection.execute(
            "SELECT record FROM utility WHERE key = ?", (key,)
        ).fetchone()
        return None if row is None else json.loads(row[0])

    def store_utility(self, key: str, identity: dict[str, Any], record: dict[str, Any]) -> None:
        text = canonical_json(identity)
        with self._write() as db:
            db.execute(
                "INSERT OR IGNORE INTO utility VALUES (?, ?, ?, ?)",
                (key, text, json.dumps(record), time.time()),
            )


def cell_key(cell: Cell) -> str:
    """The cell's key in the database: a hash of its config's identity."""
    return hashed_key(cell.key)


def hashed_key(identity: str) -> str:
    """A database key: the hash of an identity's canonical JSON."""
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


class CellResults:
    """One cell's part of the database, in the interface ``runner.run`` stores through."""

    def __init__(self, database: ExperimentDatabase, cell: Cell, device: str) -> None:
        self.database, self.cell, self.device = database, cell, device
        self.key = cell_key(cell)

    def load_finished(self) -> dict[int, dict[str, Any]]:
        row = self.database._connection.execute(
            "SELECT device FROM cells WHERE key = ?", (self.key,)
        ).fetchone()
        finished = self.database.samples(self.key)
        if row is not None and finished and row[0] != self.device:
            raise GradleakError(
                f"cell {self.cell.name} was begun on device {row[0]}: resume it with --device "
                f"{row[0]} (results differ between devices), or choose another --out"
            )
        return finished

    def start(self) -> None:
        cell = self.cell
        with self.database._write() as db:
            db.execute(
                """INSERT INTO cells (key, name, identity, config, labels, wanted, device,
                                      started)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (key) DO UPDATE SET name = excluded.name,
                       labels = excluded.labels, config = excluded.config,
                       device = CASE WHEN (SELECT COUNT(*) FROM samples WHERE cell = key) = 0
                                     THEN excluded.device ELSE device END""",
                (self.key, cell.name, cell.key, cell.config.model_dump_json(),
                 json.dumps(cell.labels), cell.config.scenario.data.n_inputs, self.device,
                 time.time()),
            )  # fmt: skip

    def append(self, sample: dict[str, Any]) -> None:
        with self.database._write() as db:
            db.execute(
                "INSERT OR IGNORE INTO samples VALUES (?, ?, ?, ?)",
                (self.key, sample["index"], json.dumps(sample), time.time()),
            )

    def finish(self, record: dict[str, Any]) -> None:
        with self.database._write() as db:
            db.execute(
                "UPDATE cells SET record = ?, finished = ? WHERE key = ?",
                (json.dumps(record), time.time(), self.key),
            )

    def adopt(self, samples: Iterable[dict[str, Any]], record: dict[str, Any] | None) -> None:
        """Take in this cell's results kept elsewhere (a single run's record or partial file,
        another experiment's cell of the same identity), in one transaction: inputs already
        stored here are kept, and ``record`` marks the cell finished."""
        self.start()
        now = time.time()
        rows = [(self.key, s["index"], json.dumps(s), now) for s in samples]
        with self.database._write() as db:
            db.executemany("INSERT OR IGNORE INTO samples VALUES (?, ?, ?, ?)", rows)
            if record is not None:
                db.execute(
                    "UPDATE cells SET record = ?, finished = ? WHERE key = ?",
                    (json.dumps(record), now, self.key),
                )
