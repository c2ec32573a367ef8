"""Whole sentences confirmed by the embedding rows of a noised update: the batch's own
sentences match the rows to the noise, a sentence one token off matches none, and a prefix a
token short is completed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gradleak.attacks.dager import DagerAttack, DagerSettings
from gradleak.attacks.dager.confirm import batch_rows, confirm, own_rows
from gradleak.data import Example
from gradleak.defenses.noise import GaussianNoise, NoiseSettings
from gradleak.defenses.settings import PruneSettings
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from tests.helpers import encode

BATCH = [Example("the cat sat on the mat", label=1), Example("a dog ran home", label=0)]


def noised_round(victim, sigma: float, protocol: Protocol | None = None):
    """A FedSGD classification round under public relative noise: the update, the server's
    view, the batch's sentences as token ids."""
    batch = encode(victim, BATCH)
    gm = GlobalModel.build(victim, protocol or Protocol(mode="train"))
    update = compute_update(gm, batch, seed=0)
    settings = NoiseSettings(sigma=sigma, relative=True)
    update = GaussianNoise(settings).apply(update, torch.Generator().manual_seed(0))
    knowledge = replace(server_knowledge(gm, batch, known_lengths=False), defenses=(settings,))
    sentences = [
        ids[mask.bool()].tolist()
        for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True)
    ]
    return update, knowledge, sentences


def test_the_rows_match_each_true_sentence_and_no_sentence_one_token_off(tiny_victim):
    update, knowledge, (first, second) = noised_round(tiny_victim("tiny-llama"), sigma=0.1)
    rows = batch_rows(update, knowledge)
    assert rows is not None and set(rows.rows) == set(first) | set(second)
    variants = [
        first[:-1],  # a token short
        [*second, first[1]],  # a token past
        [first[0], first[2], first[1], *first[3:]],  # two tokens exchanged
        [*second[:2], first[2], *second[3:]],  # one replaced
    ]
    gm = knowledge.global_model
    checked = own_rows(gm, "train", [first, second, *variants], [0], sorted(rows.rows))
    scales = [rows.explains(own.per_label[0]) for own in checked]
    assert scales[0] is not None and scales[1] is not None
    assert scales[2:] == [None] * len(variants)
    # Under label 0 the sentence of label 1's own rows point the other way: one scale each.
    assert scales[0] < 0 < scales[1]


def test_confirm_completes_a_prefix_a_token_short_and_drops_a_repeat(tiny_victim):
    update, knowledge, (first, second) = noised_round(tiny_victim("tiny-llama"), sigma=0.1)
    rows = batch_rows(update, knowledge)
    seeds = [first[:-1], [*second[:2], second[1], *second[2:]]]  # short; a token repeated
    found = confirm(rows, knowledge.global_model, "train", seeds, [0], limit=2)
    assert sorted(c.ids for c in found) == sorted([first, second])


def test_a_confirmed_sentence_spends_the_tokens_no_other_sentence_holds(tiny_victim):
    update, knowledge, (first, second) = noised_round(tiny_victim("tiny-llama"), sigma=0.1)
    rows = batch_rows(update, knowledge)
    assert rows.spent_tokens() == set()
    confirm(rows, knowledge.global_model, "train", [first], [0], limit=1)
    assert [c.ids for c in rows.confirmed] == [first]
    # the tokens the second sentence shares with it keep that one's share of their rows
    assert rows.spent_tokens() == set(first) - set(second) and rows.spent_tokens()


def test_dager_under_noise_recovers_the_batch_the_search_alone_misses(tiny_victim):
    """The whole attack under relative noise 0.03: the prefix search alone lets a token past
    one sentence's end; the rows confirm the other and complete this one."""
    update, knowledge, sentences = noised_round(tiny_victim("tiny-llama"), sigma=0.03)
    results = {}
    for on in (False, True):
        attack = DagerAttack(DagerSettings(confirm_rows=on))
        results[on] = attack.run(update, knowledge, attack.check(update, knowledge), seed=0)
    assert sorted(results[False].token_ids) != sorted(sentences)
    assert sorted(results[True].token_ids) == sorted(sentences)
    assert "2 of 2 sentences confirmed by the embedding rows" in results[True].info["notes"]


@pytest.mark.parametrize(
    "protocol",
    [
        Protocol(mode="train", freeze_embeddings=True),  # no rows sent
        Protocol(mode="train", algorithm="fedavg", epochs=2, lr=1e-3),  # several steps
    ],
    ids=["frozen", "fedavg"],
)
def test_no_rows_to_confirm_by_where_they_are_not_one_gradient(tiny_victim, protocol):
    update, knowledge, _ = noised_round(tiny_victim("tiny-llama"), 0.1, protocol)
    assert batch_rows(update, knowledge) is None


def test_no_rows_to_confirm_by_under_pruning(tiny_victim):
    update, knowledge, _ = noised_round(tiny_victim("tiny-llama"), sigma=0.1)
    pruned = replace(knowledge, defenses=(*knowledge.defenses, PruneSettings(keep=0.5)))
    assert batch_rows(update, pruned) is None


def test_beams_per_first_token_recover_the_batch_the_prefix_search_misses(tiny_victim):
    """Relative noise 0.1: the prefix search finds neither sentence close enough for the rows;
    one beam per likely first token, scored by layers 2 and 3, grows the first, and a second
    round over the tokens it did not spend grows the other."""
    update, knowledge, sentences = noised_round(tiny_victim("tiny-llama"), sigma=0.1)
    results = {}
    for on in (False, True):
        attack = DagerAttack(DagerSettings(branches=on))
        results[on] = attack.run(update, knowledge, attack.check(update, knowledge), seed=0)
    assert not set(map(tuple, results[False].token_ids)) & set(map(tuple, sentences))
    assert sorted(results[True].token_ids) == sorted(sentences)
    rounds = [n for n in results[True].info["notes"] if n.startswith("beams per first token")]
    assert len(rounds) == 2 and all(n.endswith("1 more confirmed") for n in rounds)
    # the second round grows the last sentence, which holds every token the first does not
    assert "the last sentence holding" not in rounds[0] and "the last sentence holding" in rounds[1]
