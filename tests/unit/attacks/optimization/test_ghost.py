"""Ghost statistics: the cosine and squared-L2 objectives without materialized dummy gradients
are the same objectives, with the same gradients, for every family, task, LoRA and partial
sharing."""

from __future__ import annotations

import pytest
import torch

from gradleak.attacks.optimization.ghost.low_rank import LOW_RANK_TOLERANCE, factor
from gradleak.attacks.optimization.ghost.statistics import GhostStatistics, GhostUnsupported
from gradleak.attacks.optimization.matching.objective import (
    DISTANCES,
    GradientMatcher,
    cos_distance,
    l2_distance,
)
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.federated.sharing import TensorSpec
from gradleak.models.tasks import unwrap
from tests.helpers import encode


def matcher_for(victim, protocol, distance=cos_distance, **options):
    batch = encode(victim)
    gm = GlobalModel.build(victim, protocol)
    update = compute_update(gm, batch, seed=0)
    return batch, GradientMatcher(update, server_knowledge(gm, batch), distance, **options)


CASES = [
    ("tiny-bert", "classification", Protocol(mode="eval")),
    ("tiny-gpt2", "classification", Protocol(mode="eval")),
    ("tiny-llama", "classification", Protocol(mode="eval")),
    ("tiny-gpt2", "causal_lm", Protocol(mode="eval")),
    ("tiny-llama", "causal_lm", Protocol(mode="eval")),
    ("tiny-gpt2", "classification", Protocol(mode="eval", share="1.k,*.f")),  # fused slice
    ("tiny-bert", "classification", Protocol(mode="eval", lora={"rank": 4})),
    ("tiny-gpt2", "classification", Protocol(mode="eval", lora={"rank": 4})),
]


@pytest.mark.parametrize(("name", "task", "protocol"), CASES)
def test_ghost_loss_and_its_gradient_equal_autograd(tiny_victim, name, task, protocol):
    victim = tiny_victim(name, task)
    batch, matcher = matcher_for(victim, protocol)
    assert matcher.ghost is not None
    hidden = victim.adapter.token_embedding(unwrap(matcher.model)).weight.shape[1]
    torch.manual_seed(1)
    embeds = torch.randn(*batch.input_ids.shape, hidden, requires_grad=True)
    ids = batch.input_ids if task == "causal_lm" else None
    ghost_loss = matcher.loss(embeds, ids)
    (ghost_grad,) = torch.autograd.grad(ghost_loss, [embeds])
    plain_loss = cos_distance(matcher.dummy_gradients(embeds, ids), matcher.targets)
    (plain_grad,) = torch.autograd.grad(plain_loss, [embeds])
    assert ghost_loss.item() == pytest.approx(plain_loss.item(), rel=1e-5, abs=1e-6)
    assert torch.allclose(ghost_grad, plain_grad, rtol=1e-3, atol=1e-5 * plain_grad.abs().max())


@pytest.mark.parametrize("distance", ["cos", "tag"])
@pytest.mark.parametrize(
    ("name", "task"), [("tiny-bert", "classification"), ("tiny-llama", "causal_lm")]
)
def test_stacked_candidates_keep_their_own_statistics(tiny_victim, name, task, distance):
    """Candidates stacked into one batch score as if each ran alone (and in any grouping):
    by ghost statistics for the cosine, streamed from the captures for TAG's L2 + L1 (LAMP_L2+L1's
    start and discrete rounds)."""
    victim = tiny_victim(name, task)
    batch, matcher = matcher_for(victim, Protocol(mode="eval"), DISTANCES[distance])
    assert matcher.ghost is not None if distance == "cos" else matcher.streams_candidates
    hidden = victim.adapter.token_embedding(unwrap(matcher.model)).weight.shape[1]
    candidates = torch.randn(5, *batch.input_ids.shape, hidden)
    ids = batch.input_ids.expand(5, -1, -1) if task == "causal_lm" else None
    stacked = matcher.batched_loss(candidates, ids, chunk=3)
    alone = matcher.batched_loss(candidates, ids, chunk=0)  # materialized, one by one
    assert torch.allclose(stacked, alone, rtol=1e-4, atol=1e-6)
    assert len(set(alone.tolist())) == 5  # the candidates differ, so the test can fail


@pytest.mark.parametrize(
    ("name", "task"), [("tiny-bert", "classification"), ("tiny-gpt2", "causal_lm")]
)
def test_squared_l2_from_statistics_is_the_direct_form_near_the_truth(tiny_victim, name, task):
    """DLG's loss as ``||G||^2 - 2 <G, T> + ||T||^2``: the terms cancel near the truth, where
    float64 statistics still give the direct ``||G - T||^2`` and its gradient (float32 ones
    would be off by about 1e-7 of ``||T||^2``, several times the loss at the nearer point)."""
    victim = tiny_victim(name, task)
    batch, matcher = matcher_for(victim, Protocol(mode="eval"), l2_distance)
    assert matcher.ghost is not None and matcher.ghost.target_norms.dtype == torch.float64
    table = victim.adapter.token_embedding(unwrap(matcher.model)).weight.detach()
    ids = batch.input_ids if task == "causal_lm" else None
    torch.manual_seed(1)
    direction = torch.randn(*batch.input_ids.shape, table.shape[1])
    for offset in (1e-1, 3e-4):
        embeds = (table[batch.input_ids] + offset * direction).requires_grad_()
        ghost_loss = matcher.loss(embeds, ids)
        (ghost_grad,) = torch.autograd.grad(ghost_loss, [embeds])
        dummy = matcher.dummy_gradients(embeds, ids)
        pairs = zip(dummy, matcher.targets, strict=True)
        direct = sum(((d.double() - t.double()) ** 2).sum() for d, t in pairs)
        (direct_grad,) = torch.autograd.grad(direct, [embeds])
        total = float(matcher.ghost.target_norms.sum())
        assert direct.item() < 1e-5 * total or offset > 1e-3  # near enough to cancel
        assert ghost_loss.item() == pytest.approx(direct.item(), rel=1e-3)
        scale = direct_grad.abs().max()
        assert torch.allclose(ghost_grad, direct_grad, rtol=1e-3, atol=1e-4 * scale)


def test_ghost_applies_only_where_it_is_exact(tiny_victim):
    victim = tiny_victim("tiny-bert")
    assert matcher_for(victim, Protocol(mode="eval"))[1].ghost is not None
    # TAG's L1 term needs the materialized gradient; squared L2 has a (float64) statistics form
    assert matcher_for(victim, Protocol(mode="eval"), DISTANCES["tag"])[1].ghost is None
    assert matcher_for(victim, Protocol(mode="eval"), DISTANCES["l2"])[1].ghost is not None
    fedavg = Protocol(mode="eval", algorithm="fedavg", epochs=1, lr=1e-3)
    assert matcher_for(victim, fedavg, fedavg_match="simulate")[1].ghost is None
    assert matcher_for(victim, fedavg)[1].ghost is not None  # the pseudo-gradient is plain


def test_a_module_without_a_rule_is_refused():
    model = torch.nn.Sequential(torch.nn.Conv1d(2, 2, 1))
    spec = TensorSpec(key="0.weight", param="0.weight")
    with pytest.raises(GhostUnsupported):
        GhostStatistics(model, [spec], [torch.zeros(2, 2, 1)])


def test_a_module_run_twice_is_refused():
    layer = torch.nn.Linear(3, 3)
    model = torch.nn.Sequential(layer)
    ghost = GhostStatistics(model, [TensorSpec(key="0.weight", param="0.weight")], [layer.weight])
    x = torch.randn(2, 3)
    with pytest.raises(GhostUnsupported, match="ran 2 times"):
        ghost.statistics(lambda: layer(layer(x)).sum(), rows=2)


@pytest.mark.parametrize("tokens", [2, 9])  # 9 x 9 > 4 x 3: the gradient itself is formed
def test_linear_statistics_equal_the_materialized_gradient(tokens):
    """Each group's statistics are those of its own mean loss's gradient, for linear weights
    of one shape stacked into one product (the last two layers) and of another shape alone."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    )
    specs = [
        TensorSpec(key=f"{i}.{a}", param=f"{i}.{a}") for i in (0, 1, 2) for a in ("weight", "bias")
    ]
    targets = [torch.randn_like(p) for p in layers.parameters()]
    ghost = GhostStatistics(layers, specs, targets)
    assert [len(indices) for indices, _ in ghost.linear_groups] == [1, 2]
    groups = 3
    x = torch.randn(groups, tokens, 4)
    inner, norm = ghost.statistics(lambda: layers(x).pow(2).mean(), rows=groups, groups=groups)
    assert inner.shape == norm.shape == (groups, len(specs))
    for g in range(groups):
        grads = torch.autograd.grad(layers(x[g : g + 1]).pow(2).mean(), list(layers.parameters()))
        expected = [(d * t).sum() for d, t in zip(grads, targets, strict=True)]
        assert torch.allclose(inner[g], torch.stack(expected), rtol=1e-4, atol=1e-6)
        assert torch.allclose(norm[g], torch.stack([d.pow(2).sum() for d in grads]), rtol=1e-4)
    assert not torch.allclose(inner[0], inner[1])  # the groups differ, so the test can fail


def test_a_target_of_few_tokens_is_factored_at_its_rank():
    """A received weight gradient of n tokens has rank n: it is replaced by rank-n factors
    that reproduce it to the tolerance; a noised (full-rank) one keeps the dense product."""
    torch.manual_seed(0)
    tokens, width_in, width_out = 7, 96, 80
    received = torch.randn(tokens, width_out).T @ torch.randn(tokens, width_in)  # D^T X
    left, right = factor(received.T, most=32)
    assert left.shape == (width_in, tokens) and right.shape == (width_out, tokens)
    error = torch.linalg.matrix_norm(left @ right.T - received.T) / received.norm()
    assert error <= LOW_RANK_TOLERANCE
    noised = received + 1e-3 * received.abs().mean() * torch.randn_like(received)
    assert factor(noised.T, most=32) is None


@pytest.mark.parametrize("noise", [0.0, 1e-3])
def test_factored_and_dense_targets_give_the_materialized_statistics(noise):
    """The same statistics whether the targets are low-rank (factored) or noised (dense), in
    stacked groups each with its own target, as a stacked attack holds them."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
    specs = [TensorSpec(key=f"{i}.weight", param=f"{i}.weight") for i in (0, 2)]
    groups, tokens = 3, 5
    x = torch.randn(groups, tokens, 64)
    targets = []
    for weight in (layers[0].weight, layers[2].weight):
        received = torch.stack(
            [torch.autograd.grad(layers(torch.randn(1, 6, 64)).sum(), weight)[0] for _ in x]
        )
        targets.append(received + noise * received.std() * torch.randn_like(received))
    ghost = GhostStatistics(layers, specs, targets, per_group=True)
    inner, norm = ghost.statistics(lambda: layers(x).pow(2).mean(), rows=groups, groups=groups)
    ((_, group),) = ghost.linear_groups
    assert len(group.operands) == (2 if noise == 0 else 1)
    for g in range(groups):
        params = [layers[0].weight, layers[2].weight]
        grads = torch.autograd.grad(layers(x[g : g + 1]).pow(2).mean(), params)
        expected = [(d * t[g]).sum() for d, t in zip(grads, targets, strict=True)]
        assert torch.allclose(inner[g], torch.stack(expected), rtol=1e-5, atol=1e-7)
        assert torch.allclose(norm[g], torch.stack([d.pow(2).sum() for d in grads]), rtol=1e-5)
