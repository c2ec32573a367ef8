"""The simulation's side channel: each client's private batch, for scoring only.

A real server has no private text to compare a reconstruction with. In a simulation gradleak's
own clients write each round's batch here, keyed by (round, node), and the evaluator reads it
after the attack has returned: the file never passes through the strategy, the messages or the
attack (``tests/integration/test_flower.py`` checks that with a spying attack). A SQLite file, so
that clients in other processes (Flower's simulation runs them in Ray actors) can write to it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from gradleak.data import Example

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
        connection = sqlite3.connect(self.path, timeout=60.0)
        connection.execute("PRAGMA journal_mode=WAL")
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
