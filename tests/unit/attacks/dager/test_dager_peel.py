"""DAGER on encoders: found sentences taken off a FedSGD gradient (``dager/peel.py``)."""

from __future__ import annotations

import pytest
import torch

from gradleak.attacks.dager import DagerAttack, DagerSettings
from gradleak.attacks.dager.check import layer_check
from gradleak.attacks.dager.encoder import EncoderSearch
from gradleak.attacks.dager.peel import peel, peelable, rest_tokens, without
from gradleak.attacks.dager.search import SearchState
from gradleak.attacks.dager.tokens import token_candidates
from gradleak.data import Example
from gradleak.data.sampling import sample_batches
from gradleak.data.sources import load_examples
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.models.loading import load_victim
from tests.helpers import encode

THREE = [
    Example("the cat sat on the mat", label=1),
    Example("the dog sat on a log", label=0),
    Example("a cat ran to the door", label=1),
]


def round_of(victim, examples, protocol=None, **known):
    """The client's update on ``examples`` and the server's view of it."""
    gm = GlobalModel.build(victim, protocol or Protocol(mode="eval"))
    batch = encode(victim, examples)
    update = compute_update(gm, batch, seed=0)
    return update, server_knowledge(gm, batch, **known)


def rank_of(knowledge):
    return lambda update: layer_check(update, knowledge, 1, DagerSettings()).rank


def test_the_update_less_a_sentence_is_the_rest_of_the_batch(tiny_victim):
    """Three sentences' gradient less the first one's third (its label found by the rank
    drop) is two thirds of the gradient of the other two alone."""
    victim = tiny_victim("tiny-bert")
    update, knowledge = round_of(victim, THREE, known_labels=False, known_lengths=False)
    ids = victim.tokenizer(THREE[0].text)["input_ids"]
    peeled = peel(update, knowledge, ids, rank_of(knowledge))
    assert peeled is not None
    rest, label = peeled
    assert label == 1
    alone, _ = round_of(victim, THREE[1:])
    norm = torch.linalg.vector_norm
    # float32 rounding, relative to the tensor or, for the key bias (its true gradient is 0:
    # softmax ignores it), to the largest gradient
    floor = 1e-6 * max(float(norm(t)) for t in alone.tensors.values())
    for key, value in rest.tensors.items():
        expected = alone.tensors[key] * 2 / 3
        assert norm(value - expected) <= 1e-5 * norm(expected) + floor, key


def test_a_sentence_not_in_the_batch_comes_off_under_no_label(tiny_victim):
    victim = tiny_victim("tiny-bert")
    update, knowledge = round_of(victim, THREE, known_labels=False)
    ids = victim.tokenizer("the mat sat on the cat")["input_ids"]
    assert peel(update, knowledge, ids, rank_of(knowledge)) is None


def test_the_servers_view_loses_one_sentence_of_that_length_and_label(tiny_victim):
    victim = tiny_victim("tiny-bert")
    examples = [*THREE[:2], Example("a dog ran home", label=0)]
    _, knowledge = round_of(victim, examples)
    ids = victim.tokenizer(examples[2].text)["input_ids"]
    rest = without(knowledge, ids, 0)
    assert rest.batch_size == 2
    assert rest.lengths == knowledge.lengths[:2]
    assert rest.template_ids.shape[0] == 2
    assert rest.labels["label"].tolist() == [1, 0]


def test_only_a_plain_fedsgd_classification_gradient_is_peeled(tiny_victim):
    victim = tiny_victim("tiny-bert")
    assert peelable(*round_of(victim, THREE))
    assert peelable(*round_of(victim, THREE, Protocol(mode="train", dropout=0.0)))
    assert not peelable(*round_of(victim, THREE, Protocol(mode="train", dropout=0.1)))
    assert not peelable(*round_of(victim, THREE, Protocol(algorithm="fedavg", mode="eval")))
    assert not peelable(*round_of(victim, THREE[:1]))


def test_taking_found_sentences_off_recovers_what_one_start_each_missed(tiny_victim, monkeypatch):
    """One start per length, no joint completion: the one search over the whole batch's
    spans finds one of the three sentences; taking each found one off the update lets the
    search find the others in the spans of the rest."""
    monkeypatch.setattr(EncoderSearch, "complete", lambda *args, **kwargs: [])
    victim = tiny_victim("tiny-bert")
    update, knowledge = round_of(victim, THREE, known_labels=False, known_lengths=False)
    texts = sorted(e.text for e in THREE)

    def decoded(settings):
        result = DagerAttack(settings).reconstruct(update, knowledge, seed=0)
        found = [victim.tokenizer.decode(i, skip_special_tokens=True) for i in result.token_ids]
        return sorted(found), result.info["notes"]

    peeling, notes = decoded(DagerSettings(encoder_starts=1))
    assert peeling == texts
    assert any(note.startswith("took 2 sentences off the update") for note in notes)
    paper, _ = decoded(DagerSettings(encoder_starts=1, peel=False))
    assert paper != texts


def test_a_float64_client_is_peeled_in_its_own_precision(tiny_victim):
    victim = tiny_victim("tiny-bert")
    protocol = Protocol(mode="eval", precision="float64")
    update, knowledge = round_of(victim, THREE, protocol, known_labels=False)
    assert next(iter(update.tensors.values())).dtype == torch.float64
    ids = victim.tokenizer(THREE[1].text)["input_ids"]
    peeled = peel(update, knowledge, ids, rank_of(knowledge))
    assert peeled is not None and peeled[1] == 0
    assert isinstance(peeled[0], UpdatePayload)


def test_the_rests_tokens_stay_and_the_removed_sentences_go(tiny_victim):
    """Of the whole update's layer-1 tokens, those near the remainder's span are the other
    sentences': each keeps its token at each of its positions, and a token only the removed
    sentence had at a position is gone from it."""
    victim = tiny_victim("tiny-bert")
    update, knowledge = round_of(victim, THREE, known_labels=False, known_lengths=False)
    gm = knowledge.global_model
    hf = gm.copy_model().eval()
    settings = DagerSettings()
    with torch.no_grad():
        whole = layer_check(update, knowledge, 0, settings)
        candidates = token_candidates(hf, knowledge, whole, settings, SearchState())
        removed = victim.tokenizer(THREE[0].text)["input_ids"]
        rest, label = peel(update, knowledge, removed, rank_of(knowledge))
        kept = rest_tokens(hf, gm.adapter, candidates, layer_check(rest, knowledge, 0, settings))
    others = [victim.tokenizer(e.text)["input_ids"] for e in THREE[1:]]
    for ids in others:
        assert all(token in kept[p] for p, token in enumerate(ids))
    only_removed = [
        (p, token)
        for p, token in enumerate(removed)
        if all(p >= len(ids) or ids[p] != token for ids in others)
    ]
    assert only_removed and all(token in candidates[p] for p, token in only_removed)
    assert not any(p < len(kept) and token in kept[p] for p, token in only_removed)


@pytest.mark.slow
def test_minilm_rotten_tomatoes_batch_comes_off_sentence_by_sentence(data_dir):
    """Rotten Tomatoes' first batch of four (LAMP's order, 25 to 32 tokens), lengths and
    labels unknown. The 25-token sentence dominates the gradient: taken off, the rest's
    weakest layer-1 direction sits 16x above the float32 rounding, and the token check
    rerun on the remainder's span drops true tokens; keeping the whole update's tokens near
    that span keeps them all, and the four come back exactly."""
    batch = sample_batches(load_examples("rotten_tomatoes", data_dir), 1, 4)[0]
    victim = load_victim("minilm")
    update, knowledge = round_of(victim, batch, known_labels=False, known_lengths=False)
    gm = knowledge.global_model
    hf = gm.copy_model().eval()
    settings = DagerSettings()
    rows = [victim.tokenizer(e.text)["input_ids"] for e in batch]
    shortest = min(rows, key=len)
    with torch.no_grad():
        whole = layer_check(update, knowledge, 0, settings)
        candidates = token_candidates(hf, knowledge, whole, settings, SearchState())
        rest, label = peel(update, knowledge, shortest, rank_of(knowledge))
        rest_knowledge = without(knowledge, shortest, label)
        rest_layer1 = layer_check(rest, rest_knowledge, 0, settings)
        kept = rest_tokens(hf, gm.adapter, candidates, rest_layer1)
        rechecked = token_candidates(hf, rest_knowledge, rest_layer1, settings, SearchState())
    others = [ids for ids in rows if ids is not shortest]

    def all_there(per_position):
        return all(
            p < len(per_position) and token in per_position[p]
            for ids in others
            for p, token in enumerate(ids)
        )

    assert all_there(kept) and not all_there(rechecked)
    result = DagerAttack().reconstruct(update, knowledge, seed=0)
    assert sorted(result.token_ids) == sorted(rows)


def test_an_update_whose_rank_counts_no_tokens_is_searched_once(tiny_victim, monkeypatch):
    """LoRA's adapter space caps layer 2's rank at the adapter's: no drop can confirm a
    sentence taken off, so the search runs once over the whole update."""
    runs = []
    original = EncoderSearch.run

    def spy(self, *args, **kwargs):
        runs.append(kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(EncoderSearch, "run", spy)
    protocol = Protocol(mode="eval", lora={"rank": 32, "roles": ("q", "k", "v")})
    update, knowledge = round_of(tiny_victim("tiny-bert"), THREE[:2], protocol)
    assert peelable(update, knowledge)
    DagerAttack().reconstruct(update, knowledge, seed=0)
    assert len(runs) == 1
    update, knowledge = round_of(tiny_victim("tiny-bert"), THREE[:2])
    DagerAttack().reconstruct(update, knowledge, seed=0)
    assert len(runs) == 3  # the plain gradient: one sentence found, taken off, then the other


@pytest.mark.slow
def test_minilm_true_tokens_along_the_spans_weakest_direction_pass(data_dir):
    """Rotten Tomatoes' tenth batch of four: at position 20 two of the three true tokens
    lie at 2.7e-6 and 6.1e-6 of layer 1's span (along its weakest direction), the third at
    1e-7, the nearest other token at 1.1e-4: the cut at the largest gap dropped the two;
    floored at ``TOKEN_FLOOR`` it keeps all three, and nothing else joins them there. (At
    position 10 a true token lies at 1.1e-4 among others at 1.8e-4: no cut keeps it alone.)"""
    batch = sample_batches(load_examples("rotten_tomatoes", data_dir), 10, 4)[9]
    victim = load_victim("minilm")
    update, knowledge = round_of(victim, batch, known_labels=False, known_lengths=False)
    hf = knowledge.global_model.copy_model().eval()
    settings = DagerSettings()
    with torch.no_grad():
        layer1 = layer_check(update, knowledge, 0, settings)
        candidates = token_candidates(hf, knowledge, layer1, settings, SearchState())
    rows = [victim.tokenizer(e.text)["input_ids"] for e in batch]
    at_20 = {ids[20] for ids in rows if len(ids) > 20}
    assert len(at_20) == 3 and set(candidates[20]) == at_20
