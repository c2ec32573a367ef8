"""A federation's results in one SQLite file, a round at a time: a run stopped midway keeps
every round it finished (its setup, utility and audit entries)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from gradleak.evaluation.privacy_audit import EmpiricalEpsilon
from gradleak.integrations.flower.audit import AuditEntry
from gradleak.integrations.flower.setup import FederationSetup
from gradleak.reports.federation import SCHEMA
from gradleak.runtime.environment import machine, versions
from gradleak.version import __version__


class FederationStore:
    """``federation.sqlite``: the setup, each round's utility and audit entries."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def new(cls, path: str | Path, setup: FederationSetup) -> FederationStore:
        """The store of a new run of ``setup`` (a former run's rounds in the file go)."""
        store = cls(path)
        with store._connect() as connection:
            connection.execute("DELETE FROM rounds")  # a new run of the federation
            connection.execute("DELETE FROM entries")
            meta = {
                "setup": setup.model_dump_json(),
                "gradleak_version": __version__,
                "versions": json.dumps(versions()),
                "machine": json.dumps(machine()),
                "started": str(time.time()),
            }
            connection.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta.items())
        connection.close()
        return store

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, timeout=60.0)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.executescript(SCHEMA)
        return connection

    def add_round(
        self,
        server_round: int,
        utility: dict[str, float],
        entries: list[AuditEntry],
        seconds: float,
        privacy: dict[str, EmpiricalEpsilon | None] | None = None,
    ) -> None:
        audit_seconds = sum(entry.seconds for entry in entries)
        with self._connect() as connection:
            if privacy:  # the round's measured epsilon by what scored it, beside its entries
                measured = {k: v.as_dict() if v else None for k, v in privacy.items()}
                connection.execute(
                    "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                    (f"privacy:{server_round}", json.dumps(measured)),
                )
            connection.execute(
                "INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?, ?)",
                (server_round, json.dumps(utility), seconds, audit_seconds, time.time()),
            )
            connection.executemany(
                "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?)",
                [(e.round, str(e.node), e.attack, json.dumps(e.to_dict())) for e in entries],
            )
        connection.close()

    def finish(self, seconds: float) -> None:
        with self._connect() as connection:
            connection.execute("INSERT OR REPLACE INTO meta VALUES ('seconds', ?)", (str(seconds),))
        connection.close()
