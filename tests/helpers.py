"""Helpers the tests share (imported as ``tests.helpers``): the tiny sentences and their
encoding, a word-level language model, and a part registered for the length of a block."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from gradleak.attacks.base import Attack, Plan, Reconstruction
from gradleak.attacks.dager import DagerAttack
from gradleak.attacks.settings import AttackSettings
from gradleak.data import Example
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.server import server_knowledge
from gradleak.models.tasks import encode_examples

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent  # the repository
FIXTURES = TESTS / "fixtures"
GOLDEN = TESTS / "golden"
TINY_MODELS = ("tiny-bert", "tiny-gpt2", "tiny-llama")
SENTENCES = [Example("the cat sat on the mat", label=1), Example("a dog ran home", label=0)]


def encode(victim, examples=SENTENCES):
    return encode_examples(
        victim.tokenizer, examples, victim.task, victim.adapter.max_positions(victim.model)
    )


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


@contextlib.contextmanager
def registered(registry: Any, spec: Any) -> Iterator[Any]:
    """``spec`` registered at run time in ``registry`` (a models or datasets catalog) for the
    block, and removed after."""
    registry.register_runtime(spec, package=__name__)
    try:
        yield spec
    finally:
        registry.unregister(spec.name)


# --- DAGER on a tiny model's round ---------------------------------------------------------

BATCH = [Example("the cat sat on the mat", label=1), Example("a dog ran home", label=0)]


def client_round(victim, protocol, examples=BATCH):
    """The client's update on ``examples`` and what the server knows of it."""
    batch = encode(victim, examples)
    gm = GlobalModel.build(victim, protocol)
    update = compute_update(gm, batch, seed=0)
    return update, server_knowledge(gm, batch, known_lengths=False)


def decode(victim, result):
    return sorted(victim.tokenizer.decode(i, skip_special_tokens=True) for i in result.token_ids)


def dager_attack(victim, protocol, examples=BATCH, settings=None):
    """DAGER on the client's update of ``examples``: the sorted texts it found, and its result."""
    update, knowledge = client_round(victim, protocol, examples)
    result = DagerAttack(settings).reconstruct(update, knowledge, seed=0)
    return decode(victim, result), result


# --- results folders for the reports ------------------------------------------------------

ATTACK = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='img'\">"


def experiment(tmp_path, n_inputs: int = 2) -> tuple:
    (tmp_path / "figures.yaml").write_text(textwrap.dedent("""
        source: A paper, Table 1
        setting: B=1 and 2
        figures:
          - {where: {batch_size: 1}, model: BERT, rouge1: 90.0, rouge2: 80.0}
          - {where: {attack: tag, batch_size: 2}, model: BERT, rouge1: 50.0, rouge2: 5.0}
        """))  # fmt: skip
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(f"""
        name: small
        description: DAGER on a tiny BERT.
        published: figures.yaml
        fixed: {{model: tiny-bert, dataset: demo, mode: eval, attack: dager, n_inputs: {n_inputs}}}
        axes: {{batch_size: [1, 2]}}
        """))  # fmt: skip
    return path, tmp_path / "run"


def federation_folder(tmp_path):
    """A federation's store as gradleak flower writes it, one round, one attacked client whose
    reconstruction is attacker markup."""
    from gradleak.reports.federation import FILE_NAME, SCHEMA

    folder = tmp_path / "federation"
    folder.mkdir()
    pair = {
        "reference_index": 0,
        "prediction_index": 0,
        "reference": "the spare key is here",
        "prediction": ATTACK + " key is",
        "rouge1": 40.0,
        "rouge2": 20.0,
        "rougeL": 40.0,
        "token_accuracy": 25.0,
        "exact_match": 0.0,
    }
    entry = {
        "round": 1,
        "node": 2**63 + 5,
        "attack": "dager",
        "n_samples": 1,
        "texts": [ATTACK],
        "token_ids": [[1]],
        "refusal": None,
        "seconds": 0.5,
        "pairing": "best",
        "scoring": "simulation+canaries",
        "info": {},
        "scores": {
            "simulation": {"strict": {"pairs": [pair]}},
            "canaries": [
                {
                    "canary": "pin 4921",
                    "exact": False,
                    "rouge1": 50.0,
                    "rouge2": 0.0,
                    "rougeL": 50.0,
                    "secrets": ["4921"],
                    "secrets_total": 1,
                }
            ],
        },
    }
    connection = sqlite3.connect(folder / FILE_NAME)
    connection.executescript(SCHEMA)
    setup = {
        "model": "minilm",
        "rounds": 1,
        "data": {"dataset": "demo"},
        "partition": {"clients": 2},
        "audit": {"attacks": [{"name": "dager"}]},
    }
    connection.executemany(
        "INSERT INTO meta VALUES (?, ?)",
        [("setup", json.dumps(setup)), ("machine", "{}"), ("versions", "{}")],
    )
    connection.execute("INSERT INTO rounds VALUES (0, '{\"accuracy\": 50.0}', 0, 0, 0)")
    connection.execute("INSERT INTO rounds VALUES (1, '{\"accuracy\": 62.5}', 3.0, 0.5, 0)")
    connection.execute(
        "INSERT INTO entries VALUES (1, ?, 'dager', ?)", (str(entry["node"]), json.dumps(entry))
    )
    connection.commit()
    connection.close()
    return folder


class SpyAttack(Attack):
    """Records every update and knowledge it is given; reconstructs the known template."""

    def __init__(self) -> None:
        super().__init__(AttackSettings(name="spy"))
        self.seen: list = []

    def check(self, update, knowledge):
        self.seen.append((update, knowledge))
        return Plan()

    def run(self, update, knowledge, plan, seed):
        ids = torch.where(knowledge.template_ids >= 0, knowledge.template_ids, 1000)
        return Reconstruction(
            [row[:n].tolist() for row, n in zip(ids, knowledge.lengths, strict=True)]
        )
