"""TAG's distance streamed a block of rows at a time is the materialized distance: the same
value and the same gradient in both factors, whatever the blocks, per problem."""

from __future__ import annotations

import pytest
import torch

from gradleak.attacks.optimization.ghost import streamed
from gradleak.attacks.optimization.matching.distances import tag_distance


def materialized(a, b, target, l1_weight):
    diff = a.mT @ b - target
    total = (diff**2).sum((1, 2))
    return total if l1_weight is None else total + l1_weight * diff.abs().sum((1, 2))


@pytest.mark.parametrize("block_entries", [1 << 20, 40])  # one block; blocks of a row or two
@pytest.mark.parametrize("l1_weight", [None, 0.01, 3.0])
@pytest.mark.parametrize("shared_target", [False, True])
@pytest.mark.parametrize("accelerated", [False, True])  # an accelerator's layout, run here
def test_streamed_l2_l1_is_the_materialized_distance(
    monkeypatch, block_entries, l1_weight, shared_target, accelerated
):
    monkeypatch.setattr(streamed, "BLOCK_ENTRIES", block_entries)
    monkeypatch.setattr(streamed, "DEVICE_BLOCK_ENTRIES", block_entries)
    monkeypatch.setattr(streamed, "_accelerated", lambda device: accelerated)
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


def test_an_accelerator_forms_each_weight_in_one_block_with_one_reduction_for_all(monkeypatch):
    """On a CPU the blocks fit its cache and each problem's sum is its own dot; on an
    accelerator, launch-bound, the operations a call dispatches do not grow with the stack."""

    def operations(problems: int, accelerated: bool) -> int:
        monkeypatch.setattr(streamed, "_accelerated", lambda device: accelerated)
        a = torch.randn(problems, 3, 300, requires_grad=True)
        b = torch.randn(problems, 3, 200, requires_grad=True)
        target = torch.randn(problems, 300, 200)
        with torch.profiler.profile() as profile:
            streamed.streamed_l2_l1(a, b, target, 0.1).sum().backward()
        return len(profile.events())

    cpu = [operations(p, accelerated=False) for p in (1, 40)]
    device = [operations(p, accelerated=True) for p in (1, 40)]
    assert cpu[1] > 5 * cpu[0]  # 40 problems: several blocks, 40 dots in each
    assert device[1] == device[0]


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
