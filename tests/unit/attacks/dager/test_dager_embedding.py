"""DAGER's token set from the embedding rows an update moved: exact where a zero row means an
unread token or public noise alone moves the others, absent where neither holds."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gradleak.attacks.dager import DagerAttack, DagerSettings
from gradleak.attacks.dager.embedding import moved_tokens, noise_row_cut
from gradleak.attacks.dager.search import SearchState
from gradleak.attacks.dager.tokens import token_candidates
from gradleak.data import Example
from gradleak.defenses.noise import GaussianNoise, NoiseSettings
from gradleak.defenses.settings import PruneSettings
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.models.tasks import unwrap
from tests.helpers import encode

BATCH = [Example("the cat sat on the mat", label=1), Example("a dog ran home", label=0)]


def round_of(victim, protocol):
    batch = encode(victim, BATCH)
    gm = GlobalModel.build(victim, protocol)
    update = compute_update(gm, batch, seed=0)
    tokens = set(batch.input_ids[batch.attention_mask.bool()].tolist())
    return update, server_knowledge(gm, batch, known_lengths=False), tokens


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bert"])
def test_a_gradients_moved_embedding_rows_are_the_batchs_tokens(tiny_victim, name):
    update, knowledge, tokens = round_of(tiny_victim(name), Protocol(mode="eval"))
    assert moved_tokens(update, knowledge) == tokens


def test_a_float64_clients_delta_moves_exactly_the_batchs_rows(tiny_victim):
    protocol = Protocol(mode="eval", algorithm="fedavg", epochs=2, lr=1e-3, precision="float64")
    update, knowledge, tokens = round_of(tiny_victim("tiny-llama"), protocol)
    assert moved_tokens(update, knowledge) == tokens


@pytest.mark.parametrize(
    "protocol",
    [
        Protocol(mode="eval", freeze_embeddings=True),  # no embedding tensor sent
        Protocol(mode="eval", lora={"rank": 4, "roles": ("q", "v")}),  # frozen under LoRA
        Protocol(mode="eval", algorithm="fedavg", epochs=2, lr=1e-3),  # float32 rounding
    ],
    ids=["frozen", "lora", "float32-delta"],
)
def test_no_token_set_where_the_rows_do_not_give_it(tiny_victim, protocol):
    update, knowledge, _ = round_of(tiny_victim("tiny-llama"), protocol)
    assert moved_tokens(update, knowledge) is None


def test_no_token_set_under_public_pruning(tiny_victim):
    """Pruning may zero a true row: the rows are no token set there."""
    update, knowledge, _ = round_of(tiny_victim("tiny-llama"), Protocol(mode="eval"))
    public = replace(knowledge, defenses=(PruneSettings(keep=0.5),))
    assert moved_tokens(update, public) is None


def noised(update, knowledge, sigma: float):
    """The update under public relative Gaussian noise, and the server's view of it."""
    settings = NoiseSettings(sigma=sigma, relative=True)
    generator = torch.Generator().manual_seed(0)
    return GaussianNoise(settings).apply(update, generator), replace(
        knowledge, defenses=(settings,)
    )


def test_public_noise_leaves_the_rows_the_batchs_tokens_where_layer_1_loses_some(tiny_victim):
    """Relative noise of 0.3 on every tensor: layer 1's span, cut at the noise floor, loses
    tokens of the batch; the rows above the noise are exactly its tokens, and the candidates
    hold them all."""
    update, knowledge, tokens = round_of(tiny_victim("tiny-llama"), Protocol(mode="eval"))
    update, knowledge = noised(update, knowledge, 0.3)
    assert moved_tokens(update, knowledge) == tokens
    settings = DagerSettings()
    plan = DagerAttack(settings).check(update, knowledge)
    hf = unwrap(knowledge.global_model.copy_model().eval())
    plain = token_candidates(hf, knowledge, plan.layer1, settings, SearchState())
    assert not tokens <= set(plain[0])  # layer 1 alone misses some
    state = SearchState()
    kept = token_candidates(hf, knowledge, plan.layer1, settings, state, tokens)
    assert tokens <= set(kept[0])
    assert "embedding rows above the noise" in state.notes[-1]


def test_noise_alone_moves_no_row_past_the_cut():
    """A table of pure noise: no row's norm reaches the cut (1% false alarms over the table
    by construction; none in this draw)."""
    generator = torch.Generator().manual_seed(0)
    table = 0.02 * torch.randn(5000, 64, generator=generator, dtype=torch.float64)
    norms = torch.linalg.vector_norm(table, dim=1)
    assert float(norms.max()) < noise_row_cut(0.02, 5000, 64)
    assert noise_row_cut(0.02, 5000, 64) < 0.02 * (64**0.5 + 6)  # and not far above them


def test_only_the_moved_rows_pass_a_loose_layer_1_cut(tiny_victim):
    """A cut loose enough to pass tokens the batch does not hold (layer 1 can be: a delta's
    moved copies raise its rank past the batch's tokens): with the moved rows only the batch's
    tokens pass, and the update is still recovered."""
    victim = tiny_victim("tiny-llama")
    update, knowledge, tokens = round_of(victim, Protocol(mode="eval"))
    loose = DagerSettings(l1_threshold=0.9)
    plan = DagerAttack(loose).check(update, knowledge)
    hf = unwrap(knowledge.global_model.copy_model().eval())
    state = SearchState()
    plain = token_candidates(hf, knowledge, plan.layer1, loose, state)
    assert set(plain[0]) > tokens  # false tokens pass the loose cut
    within = moved_tokens(update, knowledge)
    kept = token_candidates(hf, knowledge, plan.layer1, loose, state, within)
    assert set(kept[0]) == tokens
    assert f"{len(plain[0]) - len(tokens)} others left out" in state.notes[-1]
    result = DagerAttack(loose).reconstruct(update, knowledge, seed=0)
    decoded = sorted(victim.tokenizer.decode(i, skip_special_tokens=True) for i in result.token_ids)
    assert decoded == ["a dog ran home", "the cat sat on the mat"]
