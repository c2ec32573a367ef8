"""A rough cost of a grid before it runs (:mod:`gradleak.running.cost`), and a measured one as
it runs: once a cell has finished inputs, their mean is used instead."""

from __future__ import annotations

from dataclasses import dataclass

from gradleak.config import RunConfig
from gradleak.experiments.database import CellStatus
from gradleak.running.cost import input_seconds, training_seconds


@dataclass(frozen=True)
class CellEstimate:
    """A cell's remaining inputs and their estimated seconds; ``measured`` when the estimate
    comes from the cell's own finished inputs."""

    remaining: int
    seconds: float
    measured: bool


def estimate(config: RunConfig, status: CellStatus | None, device: str = "cpu") -> CellEstimate:
    """The remaining cost of a cell whose database status is ``status`` (None: never run), on
    one CPU core or (``device`` "cuda") one GPU where nothing of it has run yet."""
    wanted = config.scenario.data.n_inputs
    done = 0 if status is None else status.done
    remaining = max(0, wanted - done)
    if status is not None and status.done > 0:
        return CellEstimate(remaining, remaining * status.attack_s / status.done, True)
    per_input = input_seconds(config, device)
    training = training_seconds(config, device) if done == 0 else 0.0
    return CellEstimate(remaining, remaining * per_input + training, False)


def duration(seconds: float) -> str:
    """``seconds`` in words a person plans with: 45 s, 12 min, 3.4 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
