"""Matching losses adapted to the client's public defenses (Wu et al. 2023, appendix A.1).

A server that knows how the client compressed its update (``ServerKnowledge.defenses``) should
not match the dummy gradient against the compressed one as if it were a gradient: a dummy
gradient is never a vector of +-1, and the pruned zeros are not the gradient's values there.
Wu et al. modify the baselines' loss; gradleak does the same for DLG, TAG and LAMP:

* **sign** (a public ``sign`` defense): only the sign of each target coordinate is trusted.
  With ``s = sign(T)`` and the dummy gradient ``G``, their eq. 3 is the per-coordinate
  violation ``l_i = max(-G_i s_i, 0)``: zero where the dummy gradient has the target's sign,
  its size where it has the other one, zero where the target is 0 (a pruned coordinate). Each
  distance's terms are replaced by it, as their TAG is: ``||G - T||^2 -> sum_i l_i^2`` and
  ``||G - T||_1 -> sum_i l_i``, so

  - DLG (``l2``): ``sum over tensors of sum_i l_i^2``;
  - TAG (``tag``): ``sum over tensors of (sum_i l_i^2 + 0.01 sum_i l_i)``;
  - LAMP_cos (``cos``) and any distance with ``normalize=tensor``: the same terms on each
    tensor's unit dummy gradient ``G / ||G||``, averaged over tensors.

  The last is where gradleak deviates: Wu et al. replace the cosine by the unnormalized
  ``sum_i l_i^2``. The cosine is scale-free, in [0, 2], and LAMP's ``alpha_reg`` and
  ``alpha_lm`` were tuned against that scale; the unnormalized loss is in gradient units and is
  also minimized by shrinking the dummy gradient towards 0, which the unit form rules out. The
  per-tensor scale of ``sign:scale=mean`` (the tensor's mean |g|) is not used.

* **kept coordinates** (a public ``prune`` defense, with no public noise after it): the dummy
  gradient is masked by the target's nonzero pattern before the usual distance, ``D(G * m, T)``
  with ``m = [T != 0]``: the distance over the coordinates the client kept, as Wu et al. do
  for the cosine and TAG ("we only compute cosine distance over the non-zero dimensions"). For
  DLG and TAG this is ``sum over kept i of (G_i - T_i)^2 (+ 0.01 |G_i - T_i|)``; for the cosine
  and ``normalize=tensor``, the norms are the kept coordinates' norms.

Noise needs no new loss (under Gaussian noise, DLG's squared L2 is the likelihood's fit). Noise
after pruning fills the zeros, so the kept pattern is no longer visible and the plain distance
is used. A sign-compressed update also hides which tensors are null (rounding noise sent as
+-1): the matcher then finds them with a probe gradient, as for an Adam delta
(:class:`~gradleak.attacks.objective.GradientMatcher`). Neither adapted loss has a form in
ghost statistics (``<G, T>`` and ``||G||^2`` alone), so the matcher forms the dummy
gradients (:mod:`gradleak.attacks.ghost` is not used): exact. Without a public sign or prune
defense the distance is :func:`make_distance`'s, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gradleak.attacks.distances import TAG_L1_WEIGHT, Distance, make_distance, unit

SIGN = "sign"
KEPT_COORDINATES = "kept-coordinates"


def defense_names(defenses: Sequence[Any]) -> list[str]:
    return [getattr(d, "name", "") for d in defenses]


def adaptation_for(defenses: Sequence[Any]) -> str | None:
    """The adapted loss the public ``defenses`` (in the client's order) call for, or None.

    Sign compression anywhere leaves only signs (a pruned zero stays 0 under sign, and a sign
    stays a sign under pruning). Pruning alone leaves its zero pattern, which noise applied
    after it hides again.
    """
    adaptation = None
    for name in defense_names(defenses):
        if name == "sign":
            adaptation = SIGN
        elif name == "prune" and adaptation != SIGN:
            adaptation = KEPT_COORDINATES
        elif name == "noise" and adaptation == KEPT_COORDINATES:
            adaptation = None
    return adaptation


def sign_violations(dummy: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Wu et al.'s eq. 3 per coordinate: ``max(-G_i sign(T_i), 0)``."""
    return torch.relu(-dummy * torch.sign(target))


def sign_distance(l1_weight: float = 0.0, normalized: bool = False) -> Distance:
    """The sign-aware loss: per tensor ``sum l_i^2 + l1_weight sum l_i`` with ``l`` of eq. 3,
    summed over tensors; ``normalized``: on each unit dummy gradient, averaged over tensors."""

    def distance(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
        terms = []
        for d, t in zip(dummy, target, strict=True):
            violation = sign_violations(unit(d) if normalized else d, t)
            term = violation.pow(2).sum()
            if l1_weight:
                term = term + l1_weight * violation.sum()
            terms.append(term)
        stacked = torch.stack(terms)
        return stacked.mean() if normalized else stacked.sum()

    return Distance(distance)


def on_kept_coordinates(base: Distance) -> Distance:
    """``base`` over the target's nonzero coordinates: the dummy gradient masked by them."""

    def distance(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
        kept = [d * (t != 0) for d, t in zip(dummy, target, strict=True)]
        return base(kept, target)

    return Distance(distance)


def adapted_distance(
    name: str, normalize: str, defenses: Sequence[Any]
) -> tuple[Distance, str | None]:
    """The distance ``name`` (see :func:`make_distance`) adapted to the public ``defenses``,
    and the adaptation's name (None: ``make_distance``'s own distance, unchanged)."""
    base = make_distance(name, normalize)  # validates name and normalize
    adaptation = adaptation_for(defenses)
    if adaptation == SIGN:
        l1_weight = TAG_L1_WEIGHT if name == "tag" else 0.0
        return sign_distance(l1_weight, normalized=name == "cos" or normalize != "none"), SIGN
    if adaptation == KEPT_COORDINATES:
        return on_kept_coordinates(base), KEPT_COORDINATES
    return base, None
