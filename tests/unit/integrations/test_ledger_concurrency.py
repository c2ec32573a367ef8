"""The private ledger under clients writing at once from other processes."""

from __future__ import annotations

import multiprocessing
import sqlite3

from gradleak.data import Example
from gradleak.integrations.flower.ledger import Ledger, private_ledger

WRITERS = 8


def _write_after(path: str, node: int, start) -> None:
    start.wait()
    Ledger(path).write(1, node, node, [Example(text=f"client {node}", label=node % 2)])


def test_a_new_ledger_is_in_wal_mode_before_any_client_connects():
    with private_ledger() as ledger:
        connection = sqlite3.connect(ledger.path)
        mode = connection.execute("PRAGMA journal_mode").fetchone()[0]
        connection.close()
    assert mode == "wal"


def test_clients_writing_at_once_from_other_processes_all_land():
    """Flower's simulation runs clients in parallel actors; a journal-mode switch per connection
    made some of them fail at once with 'database is locked'."""
    context = multiprocessing.get_context("spawn")
    for _ in range(3):
        with private_ledger() as ledger:
            start = context.Barrier(WRITERS)
            writers = [
                context.Process(target=_write_after, args=(str(ledger.path), node, start))
                for node in range(WRITERS)
            ]
            for writer in writers:
                writer.start()
            for writer in writers:
                writer.join(60)
            assert [writer.exitcode for writer in writers] == [0] * WRITERS
            for node in range(WRITERS):
                assert ledger.read(1, node) == [Example(text=f"client {node}", label=node % 2)]
