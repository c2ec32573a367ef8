"""TAG's distance streamed a block of rows at a time is the materialized distance: the same
value and the same gradient in both factors, whatever the blocks, per problem."""

from __future__ import annotations

import pytest
import torch
from conftest import encode

from gradleak.attacks import streamed
from gradleak.attacks.distances import tag_distance
from gradleak.attacks.objective import GradientMatcher
from gradleak.data import Example
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.models.tasks import unwrap


def materialized(a, b, target, l1_weight):
    diff = a.mT @ b - target
    total = (diff**2).sum((1, 2))
    return total if l1_weight is None else total + l1_weight * diff.abs().sum((1, 2))


@pytest.mark.parametrize("block_entries", [1 << 20, 40])  # one block; blocks of a row or two
@pytest.mark.parametrize("l1_weight", [None, 0.01, 3.0])
@pytest.mark.parametrize("shared_target", [False, True])
def test_streamed_l2_l1_is_the_materialized_distance(
    monkeypatch, block_entries, l1_weight, shared_target
):
    monkeypatch.setattr(streamed, "BLOCK_ENTRIES", block_entries)
    torch.manual_seed(0)
    problems, tokens, rows, cols = 3, 5, 7, 11
    a = torch.randn(problems, tokens, rows, dtype=torch.float64, requires_grad=True)
    b = torch.randn(problems, tokens, cols, dtype=torch.float64, requires_grad=True)
    target = torch.randn(1 if shared_target else problems, rows, cols, dtype=torch.float64)
    weights = torch.tensor([1.0, 0.0, -2.5], dtype=torch.float64)  # a problem left out too
    got = streamed.streamed_l2_l1(a, b, target, l1_weight)
    expected = materialized(a, b, target, l1_weight)
    assert torch.allclose(got, expected, rtol=1e-12)
    got_a, got_b = torch.autograd.grad((got * weights).sum(), [a, b])
    want_a, want_b = torch.autograd.grad((expected * weights).sum(), [a, b])
    assert torch.allclose(got_a, want_a, rtol=1e-10, atol=1e-12)
    assert torch.allclose(got_b, want_b, rtol=1e-10, atol=1e-12)
    assert not got_a[1].any() and got_a[0].any()  # a problem's gradient is its own


def test_the_gradient_flows_on_through_the_factors():
    """The factors are themselves functions of the dummy input (captured activations and
    output gradients): the streamed distance's gradient reaches it, as the materialized one's."""
    torch.manual_seed(1)
    x = torch.randn(2, 4, 6, requires_grad=True)
    weight = torch.randn(6, 5)
    target = torch.randn(2, 6, 5)

    def factors():
        return x, torch.tanh(x @ weight)  # G = x^T tanh(x W), shaped [6, 5]

    (got,) = torch.autograd.grad(streamed.streamed_l2_l1(*factors(), target, 0.5).sum(), [x])
    (want,) = torch.autograd.grad(materialized(*factors(), target, 0.5).sum(), [x])
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_tag_says_it_can_be_streamed():
    assert tag_distance(0.01).entrywise_l1 == 0.01


@pytest.mark.parametrize(
    ("name", "task", "batch"),
    [("tiny-bert", "classification", 1), ("tiny-bert", "classification", 2),
     ("tiny-gpt2", "causal_lm", 1)],
)  # fmt: skip
def test_lamp_l2l1_candidates_scored_streamed_are_scored_as_one_by_one(
    tiny_victim, name, task, batch
):
    """LAMP_L2+L1's start and discrete rounds score candidates stacked and streamed: each
    candidate's loss is the one its own materialized gradient gives (in any grouping)."""
    victim = tiny_victim(name, task)
    examples = [Example("the cat sat on the mat", 1), Example("a dog ran", 0)][:batch]
    encoded = encode(victim, examples)
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    update = compute_update(gm, encoded, seed=0)
    matcher = GradientMatcher(update, server_knowledge(gm, encoded), tag_distance())
    assert matcher.ghost is None and matcher.streams_candidates
    hidden = victim.adapter.token_embedding(unwrap(matcher.model)).weight.shape[1]
    candidates = torch.randn(5, *encoded.input_ids.shape, hidden)
    ids = encoded.input_ids.expand(5, -1, -1) if task == "causal_lm" else None
    stacked = matcher.batched_loss(candidates, ids, chunk=3)
    alone = matcher.batched_loss(candidates, ids, chunk=0)  # materialized, one by one
    assert torch.allclose(stacked, alone, rtol=1e-5, atol=1e-7)
    assert len(set(alone.tolist())) == 5  # the candidates differ, so the test can fail
