"""The optimization attacks' matching distances adapted to the client's public defenses
(Wu et al. 2023, appendix A.1): sign-aware for a public ``sign`` defense, over the kept
coordinates for a public ``prune``. See ``docs/design/adaptive-losses.md``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gradleak.attacks.adaptive import KEPT_COORDINATES, SIGN, adaptation_for
from gradleak.attacks.optimization.matching.distances import (
    TAG_L1_WEIGHT,
    Distance,
    make_distance,
    unit,
)


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
