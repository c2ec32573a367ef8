"""DAGER against a train-mode client: the robust (L1) span check survives input dropout."""

from __future__ import annotations

import torch

from gradleak.attacks.dager import span_basis


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
