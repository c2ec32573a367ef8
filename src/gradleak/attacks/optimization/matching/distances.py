"""Distances between a dummy update and the received one, over the matched tensors.

DLG's squared L2, TAG's squared L2 plus L1, and the cosine distance (Geiping et al.; LAMP_cos).
``normalize="tensor"`` makes every tensor's term scale-free and weighs the terms equally (Li, Xu
& Dras 2024, eq. 1-4; see :func:`per_tensor`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gradleak.errors import GradleakError

TensorDistance = Callable[[list[torch.Tensor], list[torch.Tensor]], torch.Tensor]
# (inner [..., K], norm [..., K], target norms [K]) -> loss [...]: see ``Distance``.
StatisticsDistance = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Distance:
    """A distance between the dummy and the received update, over matched tensors.

    ``from_statistics``, where the distance has one, gives the same number from each tensor's
    ``<G, T>`` and squared norms alone (see :mod:`gradleak.attacks.optimization.ghost.statistics`),
    which needs no materialized dummy gradient. The cosine and squared L2 have one; TAG's L1 term
    has none. ``statistics_dtype`` is the precision the statistics are summed in where float32 is
    not enough (see :func:`_l2_statistics`).
    """

    on_tensors: TensorDistance
    from_statistics: StatisticsDistance | None = None
    statistics_dtype: torch.dtype | None = None
    # The distance of each of P problems at once, from tensors with a leading problem axis
    # (``[P, *shape]``): ``[P]``. Stacked attacks (optimization/stack.py) need one.
    grouped: TensorDistance | None = None
    # Set where the distance is ``sum_k ||G_k - T_k||^2 + entrywise_l1 ||G_k - T_k||_1``
    # (TAG): stacked, its linear weights' terms are streamed
    # (attacks/optimization/ghost/streamed.py).
    entrywise_l1: float | None = None

    def __call__(self, dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
        return self.on_tensors(dummy, target)


def _squared_l2_l1(
    dummy: list[torch.Tensor] | tuple[torch.Tensor, ...],
    target: list[torch.Tensor] | tuple[torch.Tensor, ...],
    l1_weight: float | None,
    grouped: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``sum_k ||d_k - t_k||^2 (+ l1_weight ||d_k - t_k||_1)`` and the differences; per
    problem (``[P]``) when ``grouped`` (the tensors' first axis).

    One by one this is the expression as written (what the golden records hold); grouped,
    each reduction reads the difference without writing a squared or absolute copy of it
    (a stacked pass holds P times ten million entries, and the walk over them is the cost)."""
    total, diffs = 0.0, []
    for d, t in zip(dummy, target, strict=True):
        diff = d - t
        if grouped:
            flat = diff.flatten(1)
            total = total + torch.bmm(flat[:, None], flat[:, :, None]).flatten()
            if l1_weight is not None:
                total = total + l1_weight * torch.linalg.vector_norm(flat, 1, dim=1)
        else:
            total = total + (diff**2).sum()
            if l1_weight is not None:
                total = total + l1_weight * diff.abs().sum()
        diffs.append(diff)
    return total, diffs


class _FusedL2L1(torch.autograd.Function):
    """DLG's and TAG's distance with a backward of one pass per tensor.

    Over the ten million matched entries of a small BERT the distance is memory-bound, and
    autograd's backward of ``(diff ** 2).sum() + w * diff.abs().sum()`` walks them about ten
    times (the power's and the absolute value's backward, their sum, the subtraction's). The
    gradient is ``2 diff + w sign(diff)``, formed here in the order autograd forms it, so the
    result is bit-identical; the forward is the same expression."""

    @staticmethod
    def forward(
        ctx, l1_weight: float | None, count: int, grouped: bool, *tensors: torch.Tensor
    ) -> torch.Tensor:
        total, diffs = _squared_l2_l1(tensors[:count], tensors[count:], l1_weight, grouped)
        ctx.save_for_backward(*diffs)
        ctx.l1_weight, ctx.count = l1_weight, count
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        unit = bool((grad == 1).all())  # the usual case: skip multiplying by one
        grads = []
        for diff in ctx.saved_tensors:
            if unit and ctx.l1_weight is not None:  # w sign(diff) + 2 diff: one rounding
                grads.append(diff.sign().mul_(ctx.l1_weight).add_(diff, alpha=2))
                continue
            scale = grad.view(-1, *[1] * (diff.dim() - 1)) if grad.dim() else grad
            g = diff * 2 if unit else scale * (diff * 2)
            if ctx.l1_weight is not None:
                g.add_(diff.sign().mul_(scale * ctx.l1_weight))
            grads.append(g)
        return None, None, None, *grads, *([None] * ctx.count)


def _l2_l1(
    dummy: list[torch.Tensor],
    target: list[torch.Tensor],
    l1_weight: float | None,
    grouped: bool = False,
) -> torch.Tensor:
    """The fused form where a gradient will be taken; the plain one elsewhere (under
    ``no_grad``, and inside ``vmap``, which a custom autograd function would not pass)."""
    if torch.is_grad_enabled() and any(d.requires_grad for d in dummy):
        return _FusedL2L1.apply(l1_weight, len(dummy), grouped, *dummy, *target)
    return _squared_l2_l1(dummy, target, l1_weight, grouped)[0]


def _l2(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
    """DLG: sum over tensors of the squared L2 distance."""
    return _l2_l1(dummy, target, None)


def _l2_grouped(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
    return _l2_l1(dummy, target, None, grouped=True)


def _l2_statistics(inner: torch.Tensor, norm: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """DLG's distance from the statistics: ``sum_k ||G_k||^2 - 2 <G_k, T_k> + ||T_k||^2``.

    The three terms cancel near the truth, so they are summed in float64
    (``statistics_dtype``): from the float32 captures that form ``G`` the float64 statistics
    are exact to about 1e-16 of ``||T||^2``, finer than the direct form, whose ``G`` is itself
    rounded to float32 before ``T`` is subtracted. In float32 they would resolve only about
    1e-7 of ``||T||^2``, too coarse near where DLG's loss ends
    (docs/design/optimization-speed.md)."""
    return (norm - 2 * inner + target).sum(-1)


l2_distance = Distance(_l2, _l2_statistics, torch.float64, grouped=_l2_grouped)

TAG_L1_WEIGHT = 0.01  # the LAMP reference's weight of TAG's L1 term


def tag_distance(l1_weight: float = TAG_L1_WEIGHT) -> Distance:
    """TAG: squared L2 plus ``l1_weight`` times L1 (the LAMP reference's weighting)."""

    def distance(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
        return _l2_l1(dummy, target, l1_weight)

    def grouped(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
        return _l2_l1(dummy, target, l1_weight, grouped=True)

    return Distance(distance, grouped=grouped, entrywise_l1=l1_weight)


def _cos(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
    """Mean over tensors of 1 - cosine similarity (Geiping et al.; LAMP_cos).

    Written as one dot product and two norms per tensor: ``F.cosine_similarity`` would
    materialize normalized copies of both tensors, an extra pass over every matched entry.
    """
    terms = []
    for d, t in zip(dummy, target, strict=True):
        d, t = d.flatten(), t.flatten()
        norms = torch.linalg.vector_norm(d) * torch.linalg.vector_norm(t)
        terms.append(1 - torch.dot(d, t) / norms.clamp_min(1e-12))
    return torch.stack(terms).mean()


def _cos_statistics(inner: torch.Tensor, norm: torch.Tensor, target: torch.Tensor):
    # The floor keeps sqrt's gradient finite where a dummy gradient is exactly zero (a LoRA A
    # matrix whose B is still zero); vector_norm's subgradient there is zero too.
    norms = norm.clamp_min(1e-30).sqrt() * target.sqrt()
    return (1 - inner / norms.clamp_min(1e-12)).mean(-1)


cos_distance = Distance(_cos, _cos_statistics)

DISTANCES: dict[str, Distance] = {
    "l2": l2_distance,
    "tag": tag_distance(),
    "cos": cos_distance,
}

NORMALIZATIONS = ("none", "tensor")


def unit(t: torch.Tensor) -> torch.Tensor:
    """``t`` scaled to norm 1 (a zero tensor stays zero)."""
    return t / torch.linalg.vector_norm(t).clamp_min(1e-12)


def per_tensor(distance: Distance) -> Distance:
    """Li, Xu & Dras's per-tensor normalization, for any distance ``D``.

    Their objective sums ``D(dW'_{m,i}, dW_{m,i})`` over the matched layers i and modules m
    (eq. 1), with D the cosine distance ``1 - <dW', dW> / (||dW'|| ||dW||)`` (eq. 2), and
    weighs the terms equally, ``1/l`` over all l layers (eq. 4). The cosine normalizes each
    tensor by its own norm; written for any D that is ``D(dW'/||dW'||, dW/||dW||)``, and the
    terms are averaged, ``1/n`` over the n matched tensors, as their code and LAMP's do. For
    squared L2 this is exactly ``2 (1 - cos)``: eq. 2 up to the factor 2.

    Where this deviates from the paper, and why: eq. 1 is a plain sum over (layer, module)
    pairs and eq. 4 weighs whole layers by ``1/l``; the mean over tensors has the same minimizer
    as eq. 1 and keeps the loss in [0, 2] whatever the subset, so LAMP's alpha_reg and alpha_lm
    keep their meaning. The unit is one update tensor: a module's weight and bias are separate
    terms (the paper's dW_{m,i} counts the weight matrix only; gradleak's ``3.q`` sends both).
    """

    def normalized(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
        terms = [distance([unit(d)], [unit(t)]) for d, t in zip(dummy, target, strict=True)]
        return torch.stack(terms).mean()

    return Distance(normalized)


def make_distance(name: str, normalize: str = "none") -> Distance:
    """The distance ``name`` (l2, tag, cos), per-tensor normalized when asked.

    The cosine distance already is the normalized form (eq. 2 averaged over tensors), so it is
    returned as is: normalizing copies first would give the same number at twice the cost.
    """
    if name not in DISTANCES or normalize not in NORMALIZATIONS:
        raise GradleakError(
            f"unknown distance '{name}' or normalization '{normalize}': use one of "
            f"{', '.join(DISTANCES)} and {' | '.join(NORMALIZATIONS)}"
        )
    if normalize == "none" or name == "cos":
        return DISTANCES[name]
    return per_tensor(DISTANCES[name])
