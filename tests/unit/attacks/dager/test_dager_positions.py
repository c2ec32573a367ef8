"""DAGER's token positions from an encoder update's word- and position-embedding rows: every
pair they place is the batch's, and they narrow what layer 1 cannot."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gradleak.attacks.dager import DagerAttack, DagerSettings
from gradleak.attacks.dager.embedding import moved_tokens
from gradleak.attacks.dager.positions import placed_tokens
from gradleak.attacks.dager.search import SearchState
from gradleak.attacks.dager.tokens import token_candidates
from gradleak.data import Example
from gradleak.defenses.noise import NoiseSettings
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.models.tasks import unwrap
from tests.helpers import encode

# "the" twice in the first sentence, "a" in both: tokens at several positions, which no row
# shows alone; the rest occur once.
BATCH = [
    Example("the cat sat on the mat today", label=1),
    Example("a dog ran to a park", label=0),
    Example("birds sing", label=1),
]


def round_of(victim, protocol: Protocol):
    batch = encode(victim, BATCH)
    gm = GlobalModel.build(victim, protocol)
    update = compute_update(gm, batch, seed=0)
    rows = [batch.input_ids[i, : batch.lengths[i]].tolist() for i in range(len(BATCH))]
    return update, server_knowledge(gm, batch, known_lengths=False), rows


def truth(rows: list[list[int]]) -> list[set[int]]:
    """Per position, the tokens the batch has there."""
    return [{row[p] for row in rows if len(row) > p} for p in range(max(map(len, rows)))]


@pytest.mark.parametrize(
    "protocol",
    [Protocol(mode="eval"), Protocol(mode="train", dropout=0.3)],
    ids=["eval", "dropout"],
)
def test_the_rows_place_each_token_that_occurs_at_one_position_there_alone(tiny_victim, protocol):
    """Every position keeps its true tokens; a token the batch has at one position only is
    allowed there and nowhere else; no position past the longest sentence is left. Under
    dropout too: it masks after the LayerNorm, whose input gradient stays orthogonal."""
    update, knowledge, rows = round_of(tiny_victim("tiny-bert"), protocol)
    placement = placed_tokens(update, knowledge, moved_tokens(update, knowledge))
    there = truth(rows)
    assert placement is not None and len(placement) == len(there)
    allowed = [placement.allowed(p) for p in range(len(there))]
    for p, tokens in enumerate(there):
        assert placement.placed[p] <= tokens <= allowed[p]
    once = [t for t in {t for row in rows for t in row} if sum(t in s for s in there) == 1]
    assert len(once) >= 10
    for token in once:
        assert [p for p, tokens in enumerate(allowed) if token in tokens] == [
            p for p, tokens in enumerate(there) if token in tokens
        ]
    # the tokens at several positions ("the", "a", [SEP]) leave some positions open, but
    # not all: the placement narrows
    assert sum(len(a) for a in allowed) < len(there) * len(set().union(*there))


def test_layer_1_passes_batch_tokens_at_positions_they_are_not_and_the_rows_do_not(tiny_victim):
    """Layer 1's span holds a repeated token's position difference, so batch tokens pass at
    other positions too; with the rows placed only the true ones pass where a position
    holds tokens that occur once."""
    update, knowledge, rows = round_of(tiny_victim("tiny-bert"), Protocol(mode="eval"))
    settings = DagerSettings()
    plan = DagerAttack(settings).check(update, knowledge)
    hf = unwrap(knowledge.global_model.copy_model().eval())
    within = moved_tokens(update, knowledge)
    plain = token_candidates(hf, knowledge, plan.layer1, settings, SearchState(), within)
    there = truth(rows)
    assert any(set(plain[p]) > there[p] for p in range(len(there)))  # false pairs pass
    state = SearchState()
    allowed = placed_tokens(update, knowledge, within)
    placed = token_candidates(hf, knowledge, plan.layer1, settings, state, within, allowed)
    assert len(placed) == len(there)
    assert all(set(placed[p]) >= there[p] for p in range(len(there)))
    assert sum(map(len, placed)) < sum(map(len, plain[: len(there)]))
    assert "placed by the rows" in state.notes[-1]
    result = DagerAttack(settings).reconstruct(update, knowledge, seed=0)
    assert sorted(result.token_ids) == sorted(rows)


@pytest.mark.parametrize(
    "name, protocol",
    [
        ("tiny-gpt2", Protocol(mode="eval")),  # its embedding sum enters the residual stream
        ("tiny-llama", Protocol(mode="eval")),  # rotary: no position table
        ("tiny-bert", Protocol(mode="eval", algorithm="fedavg", epochs=2, precision="float64")),
        ("tiny-bert", Protocol(mode="eval", freeze_embeddings=True)),
    ],
    ids=["gpt2", "llama", "fedavg-delta", "frozen"],
)
def test_no_placement_where_the_rows_do_not_give_it(tiny_victim, name, protocol):
    update, knowledge, _ = round_of(tiny_victim(name), protocol)
    moved = moved_tokens(update, knowledge) or {0}
    assert placed_tokens(update, knowledge, moved) is None


def test_no_placement_under_a_public_defense(tiny_victim):
    update, knowledge, _ = round_of(tiny_victim("tiny-bert"), Protocol(mode="eval"))
    moved = moved_tokens(update, knowledge)
    public = replace(knowledge, defenses=(NoiseSettings(sigma=0.01),))
    assert placed_tokens(update, public, moved) is None
