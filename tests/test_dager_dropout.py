"""DAGER against a train-mode client: the robust (L1) span check survives input dropout."""

from __future__ import annotations

import pytest
import torch
from test_dager import attack

from gradleak.attacks.dager import DagerSettings, span_basis
from gradleak.data import Example
from gradleak.federated.protocol import Protocol

SENTENCE = [Example("the cat sat on the mat", label=1)]


def test_dropout_masked_inputs_are_inliers_and_random_vectors_are_not():
    torch.manual_seed(0)
    inputs = torch.randn(6, 64)
    keep = torch.rand(6, 64) > 0.1  # the client's dropout mask, unknown to the attacker
    seen = inputs * keep / 0.9
    gradient = torch.randn(6, 96).T @ seen
    basis = span_basis([gradient], hidden_size=64)
    assert basis.rank == 6
    assert basis.distance(inputs).min() > 0.1  # the plain check no longer accepts them
    true_share = basis.inlier_fraction(inputs)
    assert torch.allclose(true_share, keep.double().mean(dim=1))
    assert basis.inlier_fraction(torch.randn(200, 64)).max() <= 6 / 64 + 1e-9


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-gpt2"])
def test_train_mode_client_with_dropout_is_recovered_by_the_robust_check(tiny_victim, name):
    victim = tiny_victim(name)
    assert victim.adapter.dropout_rate(victim.model) > 0
    robust, result = attack(victim, Protocol(mode="train"), SENTENCE)
    assert robust == ["the cat sat on the mat"]
    assert any("robust" in note for note in result.info["notes"])
    plain, _ = attack(
        victim, Protocol(mode="train"), SENTENCE, DagerSettings(dropout_check="plain")
    )
    assert plain != ["the cat sat on the mat"]  # the plain span check loses the masked inputs


def test_eval_mode_client_keeps_the_plain_check(tiny_victim):
    decoded, result = attack(tiny_victim("tiny-bert"), Protocol(mode="eval"), SENTENCE)
    assert decoded == ["the cat sat on the mat"]
    assert not any("robust" in note for note in result.info["notes"])
    assert any(note.startswith("layer-1 tokens per position") for note in result.info["notes"])
