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

import torch

from gradleak.defenses.base import RowwiseDefense
from gradleak.defenses.settings import PruneSettings
from gradleak.federated.payload import UpdatePayload


def kept_count(keep: float, numel: int) -> int:
    """``ceil(keep * numel)``, with ``keep`` as the decimal it prints as."""
    return min(numel, math.ceil(Fraction(repr(keep)) * numel))


def top_k_mask(values: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the ``k`` entries largest in magnitude of each row of ``values``
    (``[N, n]``, or one row ``[n]``); among equal magnitudes at the threshold, the earliest
    positions."""
    if values.dim() == 1:
        return top_k_mask(values[None], k)[0]
    n = values.shape[1]
    if k >= n:
        return torch.ones_like(values, dtype=torch.bool)
    if k <= 0:
        return torch.zeros_like(values, dtype=torch.bool)
    magnitude = values.abs()
    if k <= n // 2:
        # Fast path (one partial selection and no count over the rows): the selection is the
        # answer unless it left out an entry equal to its smallest, when position decides.
        top = torch.topk(magnitude, k, dim=1, sorted=False)
        threshold = top.values.amin(dim=1, keepdim=True)
        mask = torch.zeros_like(magnitude, dtype=torch.bool).scatter_(1, top.indices, True)
        if not ((magnitude == threshold) & ~mask).any():
            return mask
    else:
        threshold = torch.kthvalue(magnitude, n - k + 1, dim=1, keepdim=True).values
    mask = magnitude > threshold
    ties = magnitude == threshold
    room = k - mask.sum(dim=1, keepdim=True)
    return mask | (ties & (ties.cumsum(dim=1) <= room))


class TopKPruning(RowwiseDefense[PruneSettings]):
    """Zeroes all but the ``keep`` fraction of coordinates largest in magnitude."""

    def apply_rows(
        self, rows: UpdatePayload, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        keep, stacked = self.settings.keep, rows.tensors
        if self.settings.scope == "tensor":
            masks = {
                key: top_k_mask(t.flatten(1), kept_count(keep, t.shape[1:].numel())).view(t.shape)
                for key, t in stacked.items()
            }
        elif stacked:
            keys = sorted(stacked)  # a fixed order: ties fall the same way
            flat = torch.cat([stacked[key].flatten(1) for key in keys], dim=1)
            whole = top_k_mask(flat, kept_count(keep, flat.shape[1]))
            sizes = [stacked[key].shape[1:].numel() for key in keys]
            masks = {
                key: part.view(stacked[key].shape)
                for key, part in zip(keys, whole.split(sizes, dim=1), strict=True)
            }
        else:
            masks = {}
        return {key: torch.where(masks[key], t, torch.zeros_like(t)) for key, t in stacked.items()}
