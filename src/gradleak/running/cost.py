"""A run's rough cost before it runs, from costs measured on a 2-core x86 CPU with one torch
thread (``benchmarks/MEASURED.md``: MiniLM, CoLA, B=1): an optimization attack's steps and
discrete rounds, another attack's seconds per input, scaled by the batch size and the model.
The figures are for planning and budgeting, not promises: a busy machine or another CPU
changes them. A run's plan (:mod:`gradleak.running.plan`), an experiment's estimate and the
audit's budget use them.

``device="cuda"`` gives the same for one data-centre GPU (H100 / H200), from the few costs
measured there; what was not measured there is counted at the CPU's cost, so the GPU figure
is an upper bound for those parts (the results document's "What a GPU would add").
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
# The papers' own models (hub ids, for online users with a GPU) by their parameter counts.
BERT_BASE, GPT2 = "hf:google-bert/bert-base-uncased", "hf:openai-community/gpt2"
MODEL_FACTOR = {"minilm": 1.0, "smollm2": 6.0, "lti-lm": 0.5, "tiny-bert": 0.15,
                "tiny-gpt2": 0.15, "tiny-llama": 0.15, BERT_BASE: 4.8, GPT2: 5.5}  # fmt: skip
# An inversion model's training, per update it learns from (making and hashing the update,
# and the model's step): lti-lm 4.5 s per step of 64, MiniLM 25-38 min for 100 steps of 32.
TRAINING_SECONDS_PER_UPDATE = {"lti-lm": 0.07, "minilm": 0.6}

# One GPU: a continuous step costs about the same for 1 to 128 stacked inputs (kernel
# launches, not arithmetic; MiniLM on an H100 / H200: LAMP_cos 47-65 ms a step, TAG 54-85 ms),
# so a pass of GPU_STACK inputs costs one input's steps; a model's launches grow with its
# depth (GPU_DEPTH_FACTOR: its layers over MiniLM's 6). LAMP's discrete rounds, DAGER and the
# start were not measured on a GPU: counted at the CPU's cost. An inversion model trains at
# about 1,900 updates a second on one H200 (lti-lm, batches of 64).
GPU_STEP_SECONDS = {"dlg": 0.085, "tag": 0.085, "lamp-cos": 0.065, "lamp-l2l1": 0.065}
GPU_STACK = 20
GPU_DEPTH_FACTOR = {"minilm": 1.0, "smollm2": 5.0, "lti-lm": 1.0, BERT_BASE: 2.0, GPT2: 2.0}
GPU_TRAINING_SECONDS_PER_UPDATE = {"lti-lm": 1 / 1900}


def input_seconds(config: RunConfig, device: str = "cpu") -> float:
    """An input's seconds from the measured costs above (see the module's docstring):
    ``device`` "cpu" (one core) or "cuda" (one GPU)."""
    attack, settings = config.attack.name, config.attack
    model = config.scenario.model
    factor = MODEL_FACTOR.get(model, 1.0)
    if attack in STEP_SECONDS:
        if device == "cuda":
            depth = GPU_DEPTH_FACTOR.get(model, factor)
            steps = settings.steps * GPU_STEP_SECONDS[attack] * depth / GPU_STACK
        else:
            steps = settings.steps * STEP_SECONDS[attack] * factor
            steps *= config.scenario.data.batch_size**0.6
        rounds = settings.steps // settings.discrete_every if settings.uses_prior else 0
        return START_SECONDS + steps + rounds * DISCRETE_ROUND_SECONDS
    return SECONDS_PER_INPUT.get(attack, UNKNOWN_ATTACK_SECONDS) * factor


def training_seconds(config: RunConfig, device: str = "cpu") -> float:
    """A learned attack's training (once per cell; a cached model costs nothing) on
    ``device`` ("cpu" or "cuda", as :func:`input_seconds`)."""
    steps = getattr(config.attack, "train_steps", None)
    if steps is None:
        return 0.0
    model = config.scenario.model
    per_update = TRAINING_SECONDS_PER_UPDATE.get(model, 0.6 * MODEL_FACTOR.get(model, 1.0))
    if device == "cuda":
        per_update = GPU_TRAINING_SECONDS_PER_UPDATE.get(model, per_update)
    return steps * config.attack.train_batch * per_update
