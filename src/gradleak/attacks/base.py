"""The attack interface: an update and the server's knowledge in, token ids out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gradleak.federated.client import ClientUpdate
from gradleak.federated.server import ServerKnowledge


@dataclass
class Reconstruction:
    """An attack's guess: one token-id sequence per private sequence (specials included)."""

    token_ids: list[list[int]]
    info: dict[str, Any] = field(default_factory=dict)
    # Wall seconds of the attack's phases: how it ran, not what it found (a run with the same
    # seed reproduces ``token_ids`` and ``info``, never these).
    seconds: dict[str, float] = field(default_factory=dict)


class AttackFailed(Exception):
    """One input could not be attacked (e.g. the loss became non-finite); others go on."""


class Attack(Protocol):
    """An attack sees the update and the server's knowledge, never the private batch.

    An attack may also define ``prepare()``: the runner calls it once per run, before any input,
    to load what every input shares (LAMP's LM prior) and to raise setup errors early; and
    ``paper_pairing``, how its paper pairs predictions with references for the paper-compatible
    scores (``metrics.paper_scores``; "matched" when absent).
    """

    name: str

    def check(self, update: ClientUpdate, knowledge: ServerKnowledge) -> None:
        """Raise ``GradleakError`` if the attack cannot apply to this scenario."""

    def run(self, update: ClientUpdate, knowledge: ServerKnowledge, seed: int) -> Reconstruction:
        """Reconstruct the private batch."""
