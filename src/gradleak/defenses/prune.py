"""Top-k gradient pruning (Aji & Heafield 2017; the defense of Wu et al. 2023, Table 2).

The client keeps the ``keep`` fraction of coordinates largest in magnitude and sends the others
as 0. Wu et al.'s "pruning rate alpha = 0.99" zeroes the bottom 99%: ``keep=0.01``. Their
definition ranks every coordinate of the whole gradient at once (``scope=global``); ranking
each tensor apart (``scope=tensor``, the default) keeps every layer represented, as layer-wise
sparsification in practice does, and does not let one tensor's units crowd out another's.

The count kept out of ``n`` coordinates is ``ceil(keep * n)``, with ``keep`` read as the decimal
the user wrote (``0.1`` of 30 is 3, not 4 by float rounding): at least the declared fraction,
and at least one coordinate of any non-empty tensor. Ties at the threshold are broken by
position (the earlier flat index wins; for ``scope=global`` the tensors are laid end to end in
sorted key order), so a defended update is a function of the update alone. A tensor with fewer
nonzero coordinates than the count keeps them all (the other kept ones are zeros anyway).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import ClassVar, Literal

import torch
from pydantic import Field

from gradleak.defenses.base import DefenseSettings, UpdateDefense
from gradleak.federated.client import ClientUpdate


class PruneSettings(DefenseSettings):
    description: ClassVar[str] = (
        "top-k pruning: keep the keep fraction of coordinates largest in magnitude, per tensor "
        "or over the whole update, and send the others as 0 (Wu et al.'s rate 0.99 is keep=0.01)"
    )

    name: Literal["prune"] = "prune"
    keep: float = Field(gt=0, le=1, description="fraction of coordinates kept, in (0, 1]")
    scope: Literal["tensor", "global"] = Field(
        "tensor", description="rank the coordinates of each tensor apart, or of the whole update"
    )


def kept_count(keep: float, numel: int) -> int:
    """``ceil(keep * numel)``, with ``keep`` as the decimal it prints as."""
    return min(numel, math.ceil(Fraction(repr(keep)) * numel))


def top_k_mask(values: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the ``k`` entries of the 1-D ``values`` largest in magnitude; among
    equal magnitudes at the threshold, the earliest positions."""
    n = values.numel()
    if k >= n:
        return torch.ones(n, dtype=torch.bool, device=values.device)
    if k <= 0:
        return torch.zeros(n, dtype=torch.bool, device=values.device)
    magnitude = values.abs()
    threshold = torch.kthvalue(magnitude, n - k + 1).values  # the k-th largest
    mask = magnitude > threshold
    ties = (magnitude == threshold).nonzero().flatten()
    mask[ties[: k - int(mask.sum())]] = True
    return mask


class TopKPruning(UpdateDefense[PruneSettings]):
    """Zeroes all but the ``keep`` fraction of coordinates largest in magnitude."""

    def apply(self, update: ClientUpdate, generator: torch.Generator) -> ClientUpdate:
        keep = self.settings.keep
        if self.settings.scope == "tensor":
            masks = {
                key: top_k_mask(t.flatten(), kept_count(keep, t.numel())).view(t.shape)
                for key, t in update.tensors.items()
            }
        else:
            keys = sorted(update.tensors)  # a fixed order: ties fall the same way
            flat = torch.cat([update.tensors[k].flatten() for k in keys]) if keys else None
            whole = top_k_mask(flat, kept_count(keep, flat.numel())) if keys else None
            masks, start = {}, 0
            for key in keys:
                tensor = update.tensors[key]
                masks[key] = whole[start : start + tensor.numel()].view(tensor.shape)
                start += tensor.numel()
        tensors = {
            key: torch.where(masks[key], t, torch.zeros_like(t))
            for key, t in update.tensors.items()
        }
        return ClientUpdate(kind=update.kind, tensors=tensors, metadata=dict(update.metadata))
