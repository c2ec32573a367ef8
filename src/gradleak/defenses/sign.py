"""Sign compression: one bit per coordinate (the defense of Wu et al. 2023, Table 2).

``scale=none`` sends each coordinate's sign, as signSGD does (Bernstein et al. 2018): +1, -1,
and 0 where the coordinate is exactly 0 (``torch.sign``). ``scale=mean`` multiplies each
tensor's signs by the tensor's mean absolute value, ``||g||_1 / n``: the scaled sign compressor
of EF-SignSGD (Karimireddy et al. 2019), common in 1-bit compression because the step keeps the
gradient's L1 magnitude. The scale is one number per tensor, and the server learns it.
"""

from __future__ import annotations

import torch

from gradleak.defenses.base import RowwiseDefense
from gradleak.defenses.settings import SignSettings
from gradleak.federated.payload import UpdatePayload


class SignCompression(RowwiseDefense[SignSettings]):
    """Replaces every coordinate by its sign, optionally times its tensor's mean magnitude."""

    def apply_rows(
        self, rows: UpdatePayload, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        tensors = {}
        for key, tensor in rows.tensors.items():
            signs = torch.sign(tensor)
            if self.settings.scale == "mean" and tensor.shape[1:].numel() > 0:
                per_row = tensor.abs().flatten(1).mean(dim=1)
                signs = signs * per_row.view(-1, *[1] * (tensor.dim() - 1))
            tensors[key] = signs
        return tensors
