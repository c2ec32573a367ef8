"""Shared fixtures: tiny random-init victims (fast) and the benchmark data directory."""

from __future__ import annotations

import os

import pytest
import torch

from gradleak.data import Example
from gradleak.models.registry import load_victim
from gradleak.models.tasks import encode_examples

# Tiny models run faster on one thread (a second only adds synchronization, and on a busy
# 2-core machine every small op would wait for the other core); one thread is also
# deterministic.
torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TINY_MODELS = ("tiny-bert", "tiny-gpt2", "tiny-llama")
SENTENCES = [Example("the cat sat on the mat", label=1), Example("a dog ran home", label=0)]


def encode(victim, examples=SENTENCES):
    return encode_examples(
        victim.tokenizer, examples, victim.task, victim.adapter.max_positions(victim.model)
    )


@pytest.fixture
def tiny_victim():
    """Factory: a fresh tiny model (each test may wrap or mutate it)."""

    def make(name: str = "tiny-bert", task: str = "classification", seed: int = 0):
        return load_victim(name, task, seed=seed)

    return make
