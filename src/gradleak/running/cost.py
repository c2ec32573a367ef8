"""A run's rough cost before it runs, from costs measured on a 2-core x86 CPU with one torch
thread (``benchmarks/MEASURED.md``: MiniLM, CoLA, B=1): an optimization attack's steps and
discrete rounds, another attack's seconds per input, scaled by the batch size and the model.
The figures are for planning and budgeting, not promises: a busy machine, another CPU or a
GPU changes them. A run's plan (:mod:`gradleak.running.plan`), an experiment's estimate and
the audit's budget use them.
"""

from __future__ import annotations

from gradleak.config import RunConfig

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


def input_seconds(config: RunConfig) -> float:
    """An input's seconds from the measured costs above (see the module's docstring)."""
    attack, settings = config.attack.name, config.attack
    factor = MODEL_FACTOR.get(config.scenario.model, 1.0)
    if attack in STEP_SECONDS:
        steps = settings.steps * STEP_SECONDS[attack] * factor
        steps *= config.scenario.data.batch_size**0.6
        rounds = settings.steps // settings.discrete_every if settings.uses_prior else 0
        return START_SECONDS + steps + rounds * DISCRETE_ROUND_SECONDS
    return SECONDS_PER_INPUT.get(attack, UNKNOWN_ATTACK_SECONDS) * factor


def training_seconds(config: RunConfig) -> float:
    """A learned attack's training (once per cell; a cached model costs nothing)."""
    steps = getattr(config.attack, "train_steps", None)
    if steps is None:
        return 0.0
    model = config.scenario.model
    per_update = TRAINING_SECONDS_PER_UPDATE.get(model, 0.6 * MODEL_FACTOR.get(model, 1.0))
    return steps * config.attack.train_batch * per_update
