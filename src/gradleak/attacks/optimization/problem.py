"""What the engine keeps for each update it optimizes: its workspace and random stream, and
what the optimization has found for it so far (its best iterate, trace and rounds)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from gradleak.attacks.optimization.workspace import DummyBatch, Workspace


@dataclass
class Outcome:
    """One optimization's result: its best iterate, that iterate's loss, what it found."""

    free: torch.Tensor
    best_loss: float
    info: dict[str, Any]
    trace: list[float]  # the matching loss (with the regularizer) at every step


@dataclass
class Problem:
    """One update under attack: its workspace, label assignments and random stream, and what
    the optimization has found for it so far (several are optimized together in a stack)."""

    ws: Workspace
    assignments: list[dict[str, torch.Tensor] | None]
    generator: torch.Generator
    info: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=lambda: {"start": 0.0, "discrete": 0.0})
    dummy: DummyBatch | None = None
    best_loss: float = float("inf")
    best_free: torch.Tensor | None = None
    trace: list[float] = field(default_factory=list)
    accepted: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    error: str | None = None  # why it stopped early (a non-finite loss or gradient)

    def outcome(self) -> Outcome:
        return Outcome(
            free=self.best_free, best_loss=self.best_loss, info=self.info, trace=self.trace
        )
