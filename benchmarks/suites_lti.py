"""Learning-to-Invert suites (Wu et al. 2023): their Table 2 on their victim, LTI's dependence on
the amount of auxiliary text, and LTI-P against LAMP and DAGER on LAMP's setting.

The learned attacks train once per scenario (per defense here: one private length, the
16-token chunks) and read every input in well under a second, so their cells take many
inputs; TAG pays its whole optimization per input and gets fewer, at a reduced budget (the
table says so).
"""

from __future__ import annotations

from cells import NamedOptions, cell
from suites_defenses import COMPRESSION

# Wu et al.'s victim and samples: 16-token WikiText chunks, the test split private (the
# learned attacks train on the validation split, their default: another split of the data).
WIKI = {"task": "causal_lm", "split": "test", "chunk_tokens": 16, "mode": "train"}
# The budget: at most 60 minutes of training per model on 2 CPU cores, two models at a
# time, one thread each (measured: about 4.5 s a step of 64 updates on lti-lm, of which about
# 2.7 s makes and hashes the updates and 1.5 s is the inversion model's step); Wu et al. train
# 20 (paper) / 100 (code) epochs of 180k updates on a GPU.
TRAINING = {"train_steps": 750, "train_batch": 64, "eval_every": 50, "patience": 4}
LEARNED_INPUTS = 200  # the size: at least 200 WikiText-2 test chunks
TAG_INPUTS, TAG_STEPS = 10, 500  # TAG costs minutes per input on lti-lm at its 2500 steps
# TAG starts at the victim's embedding scale: Wu et al.'s token table has std 0.57, the scale
# of TAG's N(0, 1) start; lti-lm's has GPT-2's 0.02, which a N(0, 1) start swamps (measured on
# one chunk, 300 steps: token accuracy 6% from N(0, 1), 38% rescaled).
TAG = {"attack": "tag", "steps": TAG_STEPS, "rescale_init": True}
# MiniLM's updates cost about ten times lti-lm's to make and hash (22.7M coordinates): a
# smaller budget, about 20 minutes a model on one core.
MINILM_TRAINING = {"train_steps": 100, "train_batch": 32, "eval_every": 25, "patience": 2,
                   "held_out": 64}  # fmt: skip
COLA_LENGTH = "9"
AUX_SIZES = (1000, 5000, None)  # None: the whole validation split
BATCH_SIZES = (2, 4)


def lti_table2(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """Wu et al. Table 2: TAG (the public defense's adapted loss), LTI and LTI-P under no
    defense, sign compression, pruning keep 0.01 and Gaussian noise 0.01 on lti-lm. ``batches``
    sets the learned attacks' inputs (default 200); TAG runs 10 at 500 steps."""
    cells = []
    for label, defense in COMPRESSION.items():
        learned = {**WIKI, "defense": defense, **TRAINING}
        tag = {**WIKI, "defense": defense, **TAG}
        cells += [
            (f"tag-wiki-{label}", cell("lti-lm", "wikitext2", 1, TAG_INPUTS, data_dir, **tag)),
            (f"lti-wiki-{label}", cell("lti-lm", "wikitext2", 1, batches, data_dir,
                                       attack="lti", **learned)),
            (f"lti-p-wiki-{label}", cell("lti-lm", "wikitext2", 1, batches, data_dir,
                                         attack="lti-p", **learned)),
        ]  # fmt: skip
    return cells


def lti_aux(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """LTI under sign compression with 1k, 5k and all auxiliary chunks (WikiText-2
    validation, 16,248 chunks of SmolLM2's tokens)."""
    cells = []
    for size in AUX_SIZES:
        options = {**WIKI, "defense": "sign", **TRAINING, "attack": "lti"}
        if size is not None:
            options["aux_size"] = size
        label = "all" if size is None else f"{size // 1000}k"
        cells.append((f"lti-wiki-sign-aux{label}",
                      cell("lti-lm", "wikitext2", 1, batches, data_dir, **options)))  # fmt: skip
    return cells


def lti_vs_lamp(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """LTI-P against LAMP_cos and DAGER on MiniLM, CoLA B=1, eval- and train-mode clients,
    undefended and under each of Table 2's defenses. LTI-P hashes 1% of MiniLM's 22.7M
    coordinates (Wu et al.'s choice for BERT on CoLA). A learned model predicts one length,
    so every attack reads the same sentences of CoLA's commonest length (9 MiniLM tokens,
    [CLS] and [SEP] included): one LTI-P model per mode and defense."""
    cells = []
    for mode in ("eval", "train"):
        for label, defense in COMPRESSION.items():
            common = {"mode": mode, "defense": defense, "lengths": COLA_LENGTH}
            variants = {
                "lti-p": {"attack": "lti-p", "hash_fraction": 0.01, **MINILM_TRAINING},
                "lamp-cos": {"attack": "lamp-cos"},
                "dager": {"attack": "dager", "known_lengths": False},
            }
            for name, options in variants.items():
                fields = cell("minilm", "cola", 1, batches, data_dir, **common, **options)
                cells.append((f"{name}-cola-{mode}-{label}", fields))
    return cells


def lti_batch(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """LTI-P on Table 2's setting with B = 2 and 4 chunks per update, undefended and under sign
    compression, at Table 2's training budget in steps (B = 1 is Table 2's row). The model
    predicts B x 16 tokens; training and scoring match rows one-to-one."""
    return [
        (f"lti-p-wiki-{label}-b{size}", _wiki_lti_p(label, size, TRAINING, batches, data_dir))
        for size in BATCH_SIZES
        for label in ("none", "sign")
    ]


def lti_budget(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """LTI-P undefended and under sign compression on Table 2's setting at four times its
    training budget (3000 steps of 64 updates, several hours on a CPU core): what the
    60-minute budget leaves on the table. The job snapshots every 100 steps and resumes."""
    long = {**TRAINING, "train_steps": 3000, "eval_every": 100, "patience": 5}
    return [
        (f"lti-p-wiki-{label}-3000", _wiki_lti_p(label, 1, long, batches, data_dir))
        for label in ("none", "sign")
    ]


def _wiki_lti_p(label: str, size: int, training: dict, batches: int, data_dir: str | None):
    """An LTI-P cell on Table 2's setting: defense ``label``, B = ``size``."""
    options = {**WIKI, "defense": COMPRESSION[label], **training, "attack": "lti-p"}
    return cell("lti-lm", "wikitext2", size, batches, data_dir, **options)


SUITES = {
    "lti_table2": lti_table2,
    "lti_budget": lti_budget,
    "lti_aux": lti_aux,
    "lti_vs_lamp": lti_vs_lamp,
    "lti_batch": lti_batch,
}
DEFAULT_SIZES = {
    "lti_table2": {"batches": LEARNED_INPUTS},
    "lti_aux": {"batches": LEARNED_INPUTS},
    "lti_batch": {"batches": LEARNED_INPUTS // 2},
    "lti_budget": {"batches": LEARNED_INPUTS},
    "lti_vs_lamp": {"batches": 4, "steps": 400},
}
