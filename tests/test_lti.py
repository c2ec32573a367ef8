"""Learning to Invert (Wu et al. 2023): the feature hashing of updates."""

from __future__ import annotations

import pytest
import torch

from gradleak.attacks.lti.hashing import FeatureHasher


def test_hashing_is_deterministic_across_hashers_and_linear():
    a, b = torch.randn(5000), torch.randn(5000)
    first, second = FeatureHasher(5000, 300, seed=4), FeatureHasher(5000, 300, seed=4)
    assert torch.equal(first(a), second(a))
    torch.testing.assert_close(first(a + b), first(a) + first(b))
    torch.testing.assert_close(first(3.0 * a), 3.0 * first(a))
    assert not torch.equal(first(a), FeatureHasher(5000, 300, seed=5)(a))


def test_hashing_sums_each_coordinate_into_one_bin():
    hasher = FeatureHasher(1000, 17, seed=0)
    bins = hasher.bins(0, 1000)
    assert bins.min() >= 0 and bins.max() < 17 and len(bins.unique()) == 17
    ones = hasher(torch.ones(1000))
    assert torch.equal(ones, torch.bincount(bins, minlength=17).float())
    unit = torch.zeros(1000)
    unit[123] = 2.5
    assert hasher(unit).nonzero().flatten().tolist() == [int(bins[123])]


def test_blocks_and_batches_hash_as_the_flat_vector():
    hasher = FeatureHasher(60, 7, seed=2, signed=True)
    batch = torch.randn(3, 60)
    blocks = [batch[:, :10].reshape(3, 2, 5), batch[:, 10:]]
    together = hasher.hash_blocks(blocks, batch=3)
    assert together.shape == (3, 7)
    for row in range(3):
        torch.testing.assert_close(together[row], hasher(batch[row]))
    with pytest.raises(ValueError, match="hold 50 coordinates, the hasher 60"):
        hasher.hash_blocks([batch[0, :50]])


def test_signed_hashing_preserves_inner_products_in_expectation():
    """Over seeds, <h(a), h(b)> averages to <a, b> (one seed's spread is about |a| |b| /
    sqrt(k)); unsigned bin sums add the products of coordinates that share a bin, which for
    vectors with a mean is far off."""
    generator = torch.Generator().manual_seed(0)
    a = 1 + 0.5 * torch.randn(400, generator=generator)
    b = 1 + 0.5 * torch.randn(400, generator=generator)
    exact = float(a @ b)

    def estimates(signed: bool) -> torch.Tensor:
        hashers = [FeatureHasher(400, 40, seed=s, signed=signed) for s in range(300)]
        return torch.tensor([float(h(a) @ h(b)) for h in hashers])

    spread = float(a.norm() * b.norm()) / 40**0.5
    signed = estimates(True)
    assert abs(float(signed.mean()) - exact) < 4 * spread / 300**0.5
    assert float(signed.std()) < 2 * spread
    assert float(estimates(False).mean()) > 5 * exact


def test_bad_hasher_sizes_are_errors():
    with pytest.raises(ValueError, match="bins must be positive"):
        FeatureHasher(10, 0)
    with pytest.raises(ValueError, match="more than feature hashing takes"):
        FeatureHasher(2**31, 10)
