"""A Flower federation's results (``gradleak flower --out DIR``) as a report: each round's
utility and leakage, every audited reconstruction beside the client's batch, the canaries.

Read from ``DIR/federation.sqlite`` with sqlite3 alone, so a report needs no Flower install.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradleak.errors import GradleakError
from gradleak.runtime.files import read_only_sqlite

FILE_NAME = "federation.sqlite"
# The store gradleak flower writes (integrations/flower/store.py) and this module reads.
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY,  -- 0: the initial model
    utility TEXT NOT NULL,      -- dev metrics of the global model after the round, JSON
    seconds REAL NOT NULL,      -- the round's wall time, audit included
    audit_seconds REAL NOT NULL,
    written REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS entries (
    round INTEGER NOT NULL,
    node TEXT NOT NULL,         -- Flower's node id (64-bit unsigned, as text)
    attack TEXT NOT NULL,
    entry TEXT NOT NULL,        -- the audit entry, JSON
    PRIMARY KEY (round, node, attack)
);
"""


def round_summary(entries: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per attack: updates attacked and refused, mean attack seconds; against the clients'
    batches (simulation) the share of sentences recovered exactly and mean ROUGE-1/2; against
    the canaries, how many were recovered exactly and which secrets appeared."""
    summary: dict[str, dict[str, Any]] = {}
    for attack in dict.fromkeys(e["attack"] for e in entries):
        own = [e for e in entries if e["attack"] == attack]
        line: dict[str, Any] = {
            "updates": len(own),
            "refused": sum(e["refusal"] is not None for e in own),
            "seconds": sum(e["seconds"] for e in own) / len(own),
        }
        pairs = [
            pair
            for e in own
            if e["scores"].get("simulation")
            for pair in e["scores"]["simulation"]["strict"]["pairs"]
        ]
        if pairs:
            line["exact_%"] = sum(p["exact_match"] for p in pairs) / len(pairs)
            line["rouge1"] = sum(p["rouge1"] for p in pairs) / len(pairs)
            line["rouge2"] = sum(p["rouge2"] for p in pairs) / len(pairs)
        canaries = [c for e in own for c in e["scores"].get("canaries") or ()]
        if canaries:
            line["canaries"] = _canary_line(canaries)
        summary[attack] = line
    return summary


def _canary_line(scores: list[dict[str, Any]]) -> dict[str, Any]:
    """Over every reconstruction of the round: canaries recovered exactly (of all declared),
    the best ROUGE-L each reached, and the secrets that appeared (of all declared)."""
    by_canary: dict[str, list[dict[str, Any]]] = {}
    for score in scores:
        by_canary.setdefault(score["canary"], []).append(score)
    found = {s for score in scores for s in score["secrets"]}
    total = sum(group[0]["secrets_total"] for group in by_canary.values())
    return {
        "exact": sum(any(s["exact"] for s in group) for group in by_canary.values()),
        "of": len(by_canary),
        "best_rougeL": {c: max(s["rougeL"] for s in g) for c, g in by_canary.items()},
        "secrets": sorted(found),
        "secrets_total": total,
    }


@dataclass
class FederationReport:
    """What a federation's store holds: its setup, rounds (utility, seconds, audit entries as
    stored) and where it ran."""

    folder: Path
    setup: dict[str, Any]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    seconds: float | None = None

    def leakage(self, round_: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return round_summary(round_["entries"])

    @property
    def attacks(self) -> list[str]:
        return [a["name"] for a in self.setup.get("audit", {}).get("attacks", [])]


def is_federation(folder: str | Path) -> bool:
    return (Path(folder) / FILE_NAME).is_file()


def read_federation(folder: str | Path) -> FederationReport:
    """The federation stored in ``folder`` (rounds in order, each with its entries)."""
    path = Path(folder) / FILE_NAME
    if not path.is_file():
        raise GradleakError(
            f"{folder} holds no {FILE_NAME}: run gradleak flower ... --out {folder}"
        )
    try:
        connection = read_only_sqlite(path)
    except sqlite3.Error as exc:
        raise GradleakError(f"{path} is not a federation's store: {exc}") from None
    try:
        meta = dict(connection.execute("SELECT key, value FROM meta").fetchall())
        rows = connection.execute(
            "SELECT round, utility, seconds, audit_seconds FROM rounds ORDER BY round"
        ).fetchall()
        stored = connection.execute("SELECT round, entry FROM entries").fetchall()
    except sqlite3.DatabaseError as exc:
        raise GradleakError(f"{path} is not a federation's store: {exc}") from None
    finally:
        connection.close()
    entries: dict[int, list[dict[str, Any]]] = {}
    for round_, entry in stored:
        entries.setdefault(round_, []).append(json.loads(entry))
    for listed in entries.values():
        listed.sort(key=lambda e: (str(e["node"]), e["attack"]))
    rounds = [
        {"round": r, "utility": json.loads(u), "seconds": s, "audit_seconds": a,
         "entries": entries.get(r, []), "privacy": json.loads(meta.get(f"privacy:{r}", "null"))}
        for r, u, s, a in rows
    ]  # fmt: skip
    return FederationReport(
        folder=Path(folder),
        setup=json.loads(meta.get("setup", "{}")),
        rounds=rounds,
        machine=json.loads(meta.get("machine", "{}")),
        versions=json.loads(meta.get("versions", "{}")),
        seconds=float(meta["seconds"]) if "seconds" in meta else None,
    )
