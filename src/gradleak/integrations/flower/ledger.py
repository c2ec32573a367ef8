"""The simulation's side channel: each client's private batch, for scoring only.

A real server has no private text to compare a reconstruction with. In a simulation gradleak's
own clients write each round's batch here, keyed by (round, node), and the evaluator reads it
after the attack has returned: the file never passes through the strategy, the messages or the
attack (``tests/integration/test_flower.py`` checks that with a spying attack). A SQLite file, so
that clients in other processes (Flower's simulation runs them in Ray actors) can write to it.

The file holds every client's batch of every round in plain text, so a run keeps it no longer
than it needs it (:func:`private_ledger`): in a folder of its own in the system's temporary
folder, readable by this user only, deleted when the run ends, by an error or Ctrl-C too. A
run killed before it could delete it (kill -9, a power cut) leaves that folder behind, outside
the results folder; each later run deletes every such folder whose run is gone
(:func:`sweep`): a live run holds a lock on its folder, which the system lets go of when its
process dies. Only a caller that asks (``keep``) gets the file to keep.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gradleak.data import Example

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, no sweep (the block's end still deletes)
    fcntl = None  # type: ignore[assignment]

FILE_NAME = "private.sqlite"
# A run's ledger folder in the temporary folder: PREFIX + a random part. A folder is made
# under STAGING, locked, then renamed: a folder under PREFIX is always held by its run.
PREFIX = "gradleak-ledger-"
STAGING = "gradleak-staging-"
LOCK = ".lock"

SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    round INTEGER NOT NULL,
    node TEXT NOT NULL,         -- Flower's node id (a 64-bit unsigned id, as text)
    partition INTEGER NOT NULL, -- the client's data partition
    examples TEXT NOT NULL,     -- [{"text": ..., "label": ...}, ...] in batch order
    PRIMARY KEY (round, node)
);
"""


class Ledger:
    """Private batches by (round, node), in one SQLite file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _connect(self) -> sqlite3.Connection:
        # No journal-mode switch here: SQLite answers a switch racing another connection with
        # "database is locked" at once, past the busy timeout (clients in parallel actors
        # did). The file is put in WAL mode once, when it is made (:func:`_create_private`).
        connection = sqlite3.connect(self.path, timeout=60.0)
        connection.executescript(SCHEMA)
        return connection

    def write(self, server_round: int, node: int, partition: int, batch: list[Example]) -> None:
        """Keep a client's batch of ``server_round`` (the client side)."""
        rows = [{"text": e.text, "label": e.label} for e in batch]
        with self._connect() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO batches VALUES (?, ?, ?, ?)",
                (server_round, str(node), partition, json.dumps(rows)),
            )
        connection.close()

    def read(self, server_round: int, node: int) -> list[Example] | None:
        """The batch node ``node`` trained on in ``server_round`` (the evaluator's side), or
        None when that client wrote none (not one of gradleak's clients)."""
        with self._connect() as connection:
            row = connection.execute(
                "SELECT examples FROM batches WHERE round = ? AND node = ?",
                (server_round, str(node)),
            ).fetchone()
        connection.close()
        if row is None:
            return None
        return [Example(text=r["text"], label=r["label"]) for r in json.loads(row[0])]


@contextlib.contextmanager
def private_ledger(keep: str | Path | None = None) -> Iterator[Ledger]:
    """The ledger of one run, for the block.

    By default in a new folder of the system's temporary folder (``$TMPDIR``; mode 700, the
    file 600), deleted with its file when the block ends, by an exception too; first the
    folders of runs killed before their end are swept away (:func:`sweep`). ``keep``: the file
    to keep the ledger in instead (a former one there is replaced, the new one is readable by
    this user only), left after the block: every client's batch of every round in plain text.
    """
    if keep is not None:
        path = Path(keep)
        remove_ledger(path)
        _create_private(path)
        yield Ledger(path)
        return
    sweep()
    folder, lock = _locked_folder()
    try:
        path = folder / FILE_NAME
        _create_private(path)
        yield Ledger(path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if lock is not None:
            os.close(lock)  # the lock goes with it


def sweep(root: str | Path | None = None) -> list[Path]:
    """Delete the ledger folders in ``root`` (the system's temporary folder) that runs killed
    before their end left behind: this user's, whose lock no live process holds. Returns the
    folders deleted."""
    if fcntl is None:
        return []
    removed = []
    for folder in sorted(Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*")):
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            lock = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its run is alive
            os.close(lock)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)
        removed.append(folder)
    return removed


def remove_ledger(path: str | Path) -> None:
    """Delete the ledger file ``path`` with SQLite's files beside it (-wal, -shm, -journal)."""
    path = Path(path)
    for suffix in ("", "-wal", "-shm", "-journal"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


def _locked_folder() -> tuple[Path, int | None]:
    """A new folder for a run's ledger, and the lock this process holds on it (None where the
    system has no locks)."""
    staging = Path(tempfile.mkdtemp(prefix=STAGING))  # mode 700
    lock = None
    if fcntl is not None:
        lock = os.open(staging / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    folder = staging.with_name(PREFIX + staging.name.removeprefix(STAGING))
    os.rename(staging, folder)
    return folder, lock


def _create_private(path: Path) -> None:
    """A new ledger file readable by this user only (SQLite gives its -wal and -shm files the
    same mode), in WAL mode (kept by the file) so that clients write while the evaluator reads."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.executescript(SCHEMA)
    finally:
        connection.close()
