"""Shared fixtures: tiny random-init victims (fast) and the benchmark data directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

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
# CI sets this: there the benchmark data must be present, and its absence fails the tests.
REQUIRE_DATA = "GRADLEAK_REQUIRE_DATA"
# CI sets this too: there Chromium must be installed (`make browser`) for the report tests.
REQUIRE_BROWSER = "GRADLEAK_REQUIRE_BROWSER"
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


def word_level_lm(words: list[str], layers: int):
    """A tiny random GPT-2 over a whitespace word vocabulary (``words`` starts with <bos>,
    <pad>, <unk>): a prior whose vocabulary differs from every victim's."""
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", pad_token="<pad>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=len(words), n_embd=16, n_layer=layers, n_head=2))
    return lm, tokenizer


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark data folder ($GRADLEAK_DATA_DIR, else the repository's sibling
    shared/datasets). A user's fresh clone may have none: its tests are then skipped, saying
    why; CI requires it ($GRADLEAK_REQUIRE_DATA=1), so there a missing folder fails them."""
    env = os.environ.get("GRADLEAK_DATA_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"
    if not path.is_dir():
        message = f"benchmark data folder {path} not found: set GRADLEAK_DATA_DIR"
        if os.environ.get(REQUIRE_DATA) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium, for rendering reports headless. A fresh machine may lack it: the
    tests that need it are then skipped, saying why; CI installs it (`make browser`) and sets
    $GRADLEAK_REQUIRE_BROWSER=1, so there its absence fails them."""
    found = os.environ.get("GRADLEAK_CHROMIUM") or shutil.which("chromium")
    if found is None:
        message = "Chromium not found: `make browser` installs Debian's chromium"
        if os.environ.get(REQUIRE_BROWSER) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found
