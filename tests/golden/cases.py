"""The golden cells: small runs whose records must not change when the code is reshaped.

Each cell is a ``gradleak attack`` command line (tiny random-init models, a few steps, one
thread), its plan pinned (:data:`PLAN`: one process, one input a pass). ``regenerate.py`` writes
each cell's result fields to ``CELL.json``; ``tests/integration/test_golden.py`` runs the same
command and compares them bit for bit. Regenerate only when a result is meant to change, and say why
in the commit.
"""

from __future__ import annotations

import math
from typing import Any

# The fields of a record that a run with the same config and seed reproduces exactly.
RESULT_FIELDS = ("task", "scenario", "metrics", "failed_inputs")
# How a sample ran, not what it found: its times, its stack, the code's commit.
SAMPLE_HOW_IT_RAN = ("attack_s", "phase_s", "peak_rss_mb", "update_s", "stacked", "code")

CELLS: dict[str, list[str]] = {
    "tag_bert_train": [
        "--model", "tiny-bert", "--attack", "tag", "--steps", "12",
        "--n-inputs", "2", "--batch-size", "2",
    ],
    "dlg_gpt2_eval": [
        "--model", "tiny-gpt2", "--attack", "dlg", "--steps", "10", "--mode", "eval",
    ],
    "lamp_cos_bert": [
        "--model", "tiny-bert", "--attack", "lamp-cos", "--steps", "24", "--mode", "eval",
        "--prior", "tiny-gpt2", "--n-init", "6", "--candidates", "8", "--discrete-every", "8",
        "--batch-size", "2",
    ],
    "lamp_l2l1_llama_noprior": [
        "--model", "tiny-llama", "--attack", "lamp-l2l1", "--steps", "20", "--prior", "none",
        "--n-init", "4", "--candidates", "6", "--discrete-every", "10",
    ],
    "dager_gpt2": [
        "--model", "tiny-gpt2", "--attack", "dager", "--batch-size", "2", "--n-inputs", "2",
        "--mode", "eval",
    ],
    "dager_llama_causal": [
        "--model", "tiny-llama", "--attack", "dager", "--task", "causal_lm", "--batch-size", "2",
    ],
    "dager_bert": [
        "--model", "tiny-bert", "--attack", "dager", "--batch-size", "2", "--mode", "eval",
    ],
    "fedavg_pseudo_bert": [
        "--model", "tiny-bert", "--attack", "tag", "--steps", "10", "--protocol", "fedavg",
        "--epochs", "2", "--local-batch-size", "1", "--batch-size", "2", "--lr", "1e-3",
    ],
    "fedavg_simulate_bert": [
        "--model", "tiny-bert", "--attack", "lamp-cos", "--steps", "6", "--prior", "none",
        "--n-init", "2", "--discrete-every", "0", "--protocol", "fedavg", "--epochs", "2",
        "--lr", "1e-3", "--fedavg-match", "simulate", "--mode", "eval",
    ],
    "fedavg_dager_gpt2": [
        "--model", "tiny-gpt2", "--attack", "dager", "--protocol", "fedavg", "--epochs", "2",
        "--lr", "1e-4", "--batch-size", "2", "--mode", "eval",
    ],
    "lora_tag_bert": [
        "--model", "tiny-bert", "--attack", "tag", "--steps", "10", "--lora-rank", "4",
        "--lora-roles", "qkv",
    ],
    "lora_dager_gpt2": [
        "--model", "tiny-gpt2", "--attack", "dager", "--lora-rank", "32", "--mode", "eval",
    ],
    "partial_share_bert": [
        "--model", "tiny-bert", "--attack", "tag", "--steps", "10", "--share", "0.qkv,*.f",
        "--match", "0.qkv", "--normalize", "tensor", "--freeze-embeddings",
    ],
    "unknown_labels_lamp": [
        "--model", "tiny-bert", "--attack", "lamp-cos", "--steps", "8", "--prior", "none",
        "--n-init", "2", "--discrete-every", "0", "--no-known-labels", "--label-search",
        "init", "--batch-size", "2",
    ],
}  # fmt: skip


# The golden runs' plan, given rather than planned: a change of the planning rules must not
# change them.
PLAN = ["--workers", "1", "--stack", "1"]


def command(name: str) -> list[str]:
    """Cell ``name``'s ``gradleak attack`` options, its plan included."""
    return [*CELLS[name], *PLAN]


def result_of(record: dict) -> dict:
    """The part of a record that must be reproduced exactly (timings and versions dropped)."""
    samples = [
        {k: v for k, v in sample.items() if k not in SAMPLE_HOW_IT_RAN}
        for sample in record["samples"]
    ]
    return {**{k: record[k] for k in RESULT_FIELDS}, "samples": samples}


def matches_golden(got: dict, expected: dict) -> bool:
    """Whether a result reproduces a golden one: see ``tests/test_golden.py`` for the rule."""
    return _same(_canonical(got), _canonical(expected))


def _canonical(result: dict) -> dict:
    """Each sample's reconstructions (and the reference each is matched to) in text order."""
    samples = []
    for sample in result["samples"]:
        pairs = sorted(zip(sample["prediction"], sample["matching"], strict=True))
        ordered = {"prediction": [p for p, _ in pairs], "matching": [m for _, m in pairs]}
        samples.append({**sample, **ordered})
    return {**result, "samples": samples}


def _same(got: Any, want: Any) -> bool:
    if isinstance(got, float) or isinstance(want, float):
        return isinstance(got, int | float) and math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-5)
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in got)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want, strict=True))
    return type(got) is type(want) and got == want
