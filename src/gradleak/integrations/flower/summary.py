"""A round's leakage in a few numbers per attack, from its audit entries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gradleak.integrations.flower.audit import AuditEntry


def round_summary(entries: Sequence[AuditEntry]) -> dict[str, dict[str, Any]]:
    """Per attack: updates attacked and refused, mean attack seconds; against the clients'
    batches (simulation) the share of sentences recovered exactly and mean ROUGE-1/2; against
    the canaries, how many were recovered exactly and which secrets appeared."""
    summary: dict[str, dict[str, Any]] = {}
    for attack in dict.fromkeys(e.attack for e in entries):
        own = [e for e in entries if e.attack == attack]
        line: dict[str, Any] = {
            "updates": len(own),
            "refused": sum(e.refusal is not None for e in own),
            "seconds": sum(e.seconds for e in own) / len(own),
        }
        pairs = [
            pair
            for e in own
            if e.scores.get("simulation")
            for pair in e.scores["simulation"]["strict"]["pairs"]
        ]
        if pairs:
            line["exact_%"] = sum(p["exact_match"] for p in pairs) / len(pairs)
            line["rouge1"] = sum(p["rouge1"] for p in pairs) / len(pairs)
            line["rouge2"] = sum(p["rouge2"] for p in pairs) / len(pairs)
        canaries = [c for e in own for c in e.scores.get("canaries") or ()]
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
