"""A rough cost of a grid before it runs, and a measured one as it runs.

Before a cell has finished inputs, its cost is the attack's seconds per input measured on a
2-core x86 CPU with one torch thread (``benchmarks/MEASURED.md``: MiniLM, CoLA, B=1), scaled
by the attack's steps, the batch size (a step's cost grew as about B^0.6 from B=1 to 16) and
the model's size relative to MiniLM. Once a cell has finished inputs, their mean is used
instead. The figures are for ordering and budgeting, not promises: a busy machine, another
CPU or a GPU changes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradleak.config import RunConfig
from gradleak.experiments.database import CellStatus

# Seconds per input at the attack's default budget, MiniLM, CoLA, B=1, one thread.
SECONDS_PER_INPUT = {
    "dlg": 250.0,  # like TAG: 2500 steps of about 0.1 s
    "tag": 250.0,
    "lamp-cos": 140.0,  # 2000 steps of about 0.06 s and 24 discrete rounds
    "lamp-l2l1": 140.0,
    "dager": 1.5,
    "lti": 0.05,  # reading an update; the training is per cell (below)
    "lti-p": 0.05,
}
DEFAULT_STEPS = {"dlg": 2500, "tag": 2500, "lamp-cos": 2000, "lamp-l2l1": 2000}
# An inversion model's training, per update it learns from (making and hashing the update,
# and the model's step): lti-lm 4.5 s per step of 64, MiniLM 25-38 min for 100 steps of 32.
TRAINING_SECONDS_PER_UPDATE = {"lti-lm": 0.07, "minilm": 0.6}
# A model's cost relative to MiniLM's (22.7M parameters) for the same input.
MODEL_FACTOR = {"minilm": 1.0, "smollm2": 6.0, "lti-lm": 0.5, "tiny-bert": 0.02,
                "tiny-gpt2": 0.02, "tiny-llama": 0.02}  # fmt: skip
UNKNOWN_ATTACK_SECONDS = 60.0


@dataclass(frozen=True)
class CellEstimate:
    """A cell's remaining inputs and their estimated seconds; ``measured`` when the estimate
    comes from the cell's own finished inputs."""

    remaining: int
    seconds: float
    measured: bool


def estimate(config: RunConfig, status: CellStatus | None) -> CellEstimate:
    """The remaining cost of a cell whose database status is ``status`` (None: never run)."""
    wanted = config.scenario.data.n_inputs
    done = 0 if status is None else status.done
    remaining = max(0, wanted - done)
    if status is not None and status.done > 0:
        return CellEstimate(remaining, remaining * status.attack_s / status.done, True)
    per_input = _hinted_seconds(config)
    training = _training_seconds(config) if done == 0 else 0.0
    return CellEstimate(remaining, remaining * per_input + training, False)


def _hinted_seconds(config: RunConfig) -> float:
    attack = config.attack.name
    seconds = SECONDS_PER_INPUT.get(attack, UNKNOWN_ATTACK_SECONDS)
    steps = getattr(config.attack, "steps", None)
    if steps is not None and attack in DEFAULT_STEPS:
        seconds *= steps / DEFAULT_STEPS[attack]
    seconds *= config.scenario.data.batch_size**0.6
    return seconds * MODEL_FACTOR.get(config.scenario.model, 1.0)


def _training_seconds(config: RunConfig) -> float:
    """A learned attack's training (once per cell; a cached model costs nothing)."""
    steps = getattr(config.attack, "train_steps", None)
    if steps is None:
        return 0.0
    model = config.scenario.model
    per_update = TRAINING_SECONDS_PER_UPDATE.get(model, 0.6 * MODEL_FACTOR.get(model, 1.0))
    return steps * config.attack.train_batch * per_update


def duration(seconds: float) -> str:
    """``seconds`` in words a person plans with: 45 s, 12 min, 3.4 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
