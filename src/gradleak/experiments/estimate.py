"""A rough cost of a grid before it runs, and a measured one as it runs.

Before a cell has finished inputs, its cost is built from costs measured on a 2-core x86 CPU
with one torch thread (``benchmarks/MEASURED.md``: MiniLM, CoLA, B=1): an optimization
attack's steps and discrete rounds, another attack's seconds per input, scaled by the batch
size and the model. Once a cell has finished inputs, their mean is used
instead. The figures are for ordering and budgeting, not promises: a busy machine, another
CPU or a GPU changes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradleak.config import RunConfig
from gradleak.experiments.database import CellStatus

# Optimization attacks: a continuous step's seconds on MiniLM for one sequence (LAMP's cosine
# loss: 0.06 s; TAG and DLG write the dummy gradient out for their L1 term: 0.1 s), times the
# model's factor and B^0.6 (a step's cost grew about so from B=1 to 16); plus LAMP's discrete
# rounds (one per discrete_every steps), whose cost is the LM prior's scoring of 200
# candidates (about 2.5 s a round, whatever the victim).
STEP_SECONDS = {"dlg": 0.1, "tag": 0.1, "lamp-cos": 0.06, "lamp-l2l1": 0.06}
DISCRETE_ROUND_SECONDS = 2.5
START_SECONDS = 5.0  # loading, the client's update, the start's candidates
# Other attacks: seconds per input (MiniLM, B=1), times the model's factor.
SECONDS_PER_INPUT = {"dager": 1.5, "lti": 0.05, "lti-p": 0.05}
UNKNOWN_ATTACK_SECONDS = 60.0
# A model's cost relative to MiniLM's (22.7M parameters) for the same input; a tiny model's
# steps are dominated by per-operation overhead, not its size.
MODEL_FACTOR = {"minilm": 1.0, "smollm2": 6.0, "lti-lm": 0.5, "tiny-bert": 0.15,
                "tiny-gpt2": 0.15, "tiny-llama": 0.15}  # fmt: skip
# An inversion model's training, per update it learns from (making and hashing the update,
# and the model's step): lti-lm 4.5 s per step of 64, MiniLM 25-38 min for 100 steps of 32.
TRAINING_SECONDS_PER_UPDATE = {"lti-lm": 0.07, "minilm": 0.6}


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
    """An input's seconds from the measured costs above (see the module's docstring)."""
    attack, settings = config.attack.name, config.attack
    factor = MODEL_FACTOR.get(config.scenario.model, 1.0)
    if attack in STEP_SECONDS:
        steps = settings.steps * STEP_SECONDS[attack] * factor
        steps *= config.scenario.data.batch_size**0.6
        rounds = settings.steps // settings.discrete_every if settings.uses_prior else 0
        return START_SECONDS + steps + rounds * DISCRETE_ROUND_SECONDS
    return SECONDS_PER_INPUT.get(attack, UNKNOWN_ATTACK_SECONDS) * factor


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
