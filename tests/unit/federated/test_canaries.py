"""Canary clients: seeded coins, rounds and directions, the update a canary sends, and its
score against the round's aggregate."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gradleak.defenses import build_defenses
from gradleak.defenses.settings import DpSgdSettings, NoiseSettings, SignSettings
from gradleak.errors import GradleakError
from gradleak.evaluation.canary_audit import CanaryAudit, update_norm
from gradleak.evaluation.utility import ServerStep
from gradleak.federated.canaries import CanaryClients
from gradleak.federated.client import GlobalModel
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.protocol import Protocol

SHAPES = {"b.weight": (3, 4), "a.bias": (5,)}


def template(kind: str = "gradient", scale: float = 1.0) -> UpdatePayload:
    generator = torch.Generator().manual_seed(7)
    tensors = {
        key: scale * torch.randn(shape, generator=generator) for key, shape in SHAPES.items()
    }
    return UpdatePayload(kind, tensors, {"n_samples": 2})


def flat(tensors) -> torch.Tensor:
    return torch.cat([tensors[key].double().flatten() for key in sorted(tensors)])


def test_the_coins_rounds_and_directions_follow_the_recorded_seed():
    canaries = CanaryClients(count=200, rounds=3, seed=11)
    again = CanaryClients(count=200, rounds=3, seed=11)
    other = CanaryClients(count=200, rounds=3, seed=12)
    assert np.array_equal(canaries.inserted, again.inserted)
    assert np.array_equal(canaries.round_of, again.round_of)
    assert not np.array_equal(canaries.inserted, other.inserted)
    like = template().tensors
    for index in (0, 57, 199):
        assert torch.equal(
            flat(canaries.direction(index, like)), flat(again.direction(index, like))
        )
        assert not torch.equal(
            flat(canaries.direction(index, like)), flat(other.direction(index, like))
        )
    # fair coins: 200 draws of Binomial(200, 1/2) lie within 5 standard deviations of 100
    assert abs(int(canaries.inserted.sum()) - 100) < 5 * math.sqrt(50)
    # the rounds are an even split, whatever the coins
    assert sorted(np.bincount(canaries.round_of).tolist()) == [66, 67, 67]
    assert sorted(sum((canaries.of_round(r) for r in range(3)), [])) == list(range(200))
    assert canaries.inserted_in(1) == [i for i in canaries.of_round(1) if canaries.inserted[i]]


def test_a_direction_is_a_unit_vector_shaped_like_the_update():
    canaries = CanaryClients(count=4, rounds=1, seed=0)
    like = template().tensors
    direction = canaries.direction(2, like)
    assert {k: tuple(t.shape) for k, t in direction.items()} == SHAPES
    assert all(t.dtype == torch.float32 for t in direction.values())
    assert float(flat(direction).norm()) == pytest.approx(1.0, abs=1e-6)
    as64 = canaries.direction(2, {k: t.double() for k, t in like.items()})
    assert all(t.dtype == torch.float64 for t in as64.values())


def test_a_canary_sends_its_norm_times_its_direction_with_the_rounds_facts():
    canaries = CanaryClients(count=4, rounds=1, seed=3)
    like = template("weight_delta")
    sent = canaries.update(1, like, norm=2.5)
    assert sent.kind == "weight_delta" and sent.metadata == like.metadata
    for key, tensor in canaries.direction(1, like.tensors).items():
        assert torch.equal(sent.tensors[key], 2.5 * tensor)
    assert update_norm(sent) == pytest.approx(2.5, rel=1e-6)


def test_a_canary_client_changes_the_aggregate_exactly_as_declared(tiny_victim):
    """The server's mean over the real clients and the inserted canaries, each canary's update
    its norm times its direction: the model moves by exactly that mean."""
    victim = tiny_victim("tiny-bert")
    gm = GlobalModel.build(victim, Protocol(algorithm="fedavg", share="0.qv"))
    params = dict(gm.model.named_parameters())
    before = {s.key: s.take(params[s.param]).detach().clone() for s in gm.specs}
    torch.manual_seed(0)
    real = [
        UpdatePayload("weight_delta", {s.key: torch.randn_like(before[s.key]) for s in gm.specs})
        for _ in range(2)
    ]
    canaries = CanaryClients(count=8, rounds=1, seed=5)
    audit = CanaryAudit(canaries, [], norm=3.0)
    mean = audit.round_mean(0, real, [1.0, 2.0])
    inserted = canaries.inserted_in(0)
    assert len(inserted) >= 1
    ServerStep(gm).step(mean, "weight_delta")
    for spec in gm.specs:
        directions = [canaries.direction(i, real[0].tensors)[spec.key] for i in inserted]
        expected = (sum(u.tensors[spec.key] for u in real) + 3.0 * sum(directions)) / (
            2 + len(inserted)
        )
        torch.testing.assert_close(mean[spec.key], expected, rtol=1e-5, atol=1e-6)
        moved = spec.take(params[spec.param]) - before[spec.key]
        torch.testing.assert_close(moved, expected, rtol=1e-5, atol=1e-6)


def test_a_canary_goes_through_the_clients_per_update_defenses_with_its_own_seed():
    canaries = CanaryClients(count=8, rounds=1, seed=5)
    sign = build_defenses([SignSettings()])
    audit = CanaryAudit(canaries, sign, norm=2.0)
    sent = audit.canary_update(3, template())
    for key, tensor in canaries.direction(3, template().tensors).items():
        assert torch.equal(sent.tensors[key], torch.sign(tensor))
    noise = build_defenses([NoiseSettings(sigma=0.5)])
    first = CanaryAudit(canaries, noise, norm=2.0).canary_update(3, template())
    again = CanaryAudit(canaries, noise, norm=2.0).canary_update(3, template())
    other = CanaryAudit(canaries, noise, norm=2.0).canary_update(4, template())
    assert torch.equal(flat(first.tensors), flat(again.tensors))
    clean = {k: 2.0 * t for k, t in canaries.direction(3, template().tensors).items()}
    noise_of = flat(first.tensors) - flat(clean)
    assert 0.3 < float(noise_of.std()) < 0.7
    assert not torch.equal(
        noise_of, flat(other.tensors) - 2.0 * flat(canaries.direction(4, template().tensors))
    )


def test_a_score_is_the_cosine_of_the_direction_with_the_aggregate():
    canaries = CanaryClients(count=6, rounds=2, seed=1)
    aggregate = template(scale=0.3).tensors
    scores = canaries.scores(1, aggregate)
    assert sorted(scores) == canaries.of_round(1)
    for index, score in scores.items():
        direction = flat(canaries.direction(index, aggregate))
        expected = float(direction @ flat(aggregate) / flat(aggregate).norm())
        assert score == pytest.approx(expected, rel=1e-6)  # the direction rounded to float32
    with pytest.raises(GradleakError, match="round 1's aggregate is zero"):
        canaries.scores(0, {key: torch.zeros(shape) for key, shape in SHAPES.items()})


def test_an_inserted_canary_stands_out_and_a_held_out_one_does_not():
    """In 2,000 dimensions a held-out canary's cosine is about N(0, 1/2000); with about 20
    inserted canaries as large as each of 3 real updates, an inserted one's cosine with the
    mean is about 1/sqrt(23)."""
    generator = torch.Generator().manual_seed(0)
    real = [UpdatePayload("gradient", {"w": torch.randn(2000, generator=generator)})]
    real += [UpdatePayload("gradient", {"w": torch.randn(2000, generator=generator)})]
    real += [UpdatePayload("gradient", {"w": torch.randn(2000, generator=generator)})]
    canaries = CanaryClients(count=40, rounds=1, seed=2)
    audit = CanaryAudit(canaries, [])
    norms = [update_norm(u) for u in real]
    mean = audit.round_mean(0, real, norms)
    assert audit.norm == sorted(norms)[1]  # the median norm of the real updates
    audit.score(0, mean)
    result = audit.result()
    ins = [audit.scores[i] for i in range(40) if canaries.inserted[i]]
    outs = [audit.scores[i] for i in range(40) if not canaries.inserted[i]]
    assert min(ins) > 5 / math.sqrt(2000) > max(abs(s) for s in outs)
    assert result.overall.auroc == 1.0
    assert result.overall.gdp_epsilon == pytest.approx(result.overall.ceiling)
    assert result.rounds == [result.overall]


def test_a_per_sample_defense_beside_canary_clients_is_one_line():
    dpsgd = build_defenses([DpSgdSettings(clip=1.0, sigma=1.0)])
    with pytest.raises(GradleakError, match="drop --canaries, or dpsgd from --defense") as error:
        CanaryAudit(CanaryClients(count=4, rounds=1, seed=0), dpsgd)
    assert "\n" not in str(error.value)


def test_fewer_than_two_canaries_are_refused():
    with pytest.raises(GradleakError, match="at least 2 canaries"):
        CanaryClients(count=1, rounds=1, seed=0)
