"""Sign compression: one bit per coordinate (the defense of Wu et al. 2023, Table 2).

``scale=none`` sends each coordinate's sign, as signSGD does (Bernstein et al. 2018): +1, -1,
and 0 where the coordinate is exactly 0 (``torch.sign``). ``scale=mean`` multiplies each
tensor's signs by the tensor's mean absolute value, ``||g||_1 / n``: the scaled sign compressor
of EF-SignSGD (Karimireddy et al. 2019), common in 1-bit compression because the step keeps the
gradient's L1 magnitude. The scale is one number per tensor, and the server learns it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field

from gradleak.defenses.base import DefenseSettings, UpdateDefense
from gradleak.federated.client import ClientUpdate


class SignSettings(DefenseSettings):
    description: ClassVar[str] = (
        "sign compression: each coordinate's sign (0 where it is 0), as signSGD sends it, or "
        "(scale=mean) times each tensor's mean absolute value"
    )

    name: Literal["sign"] = "sign"
    scale: Literal["none", "mean"] = Field(
        "none", description="none: the signs (signSGD); mean: times each tensor's mean |g|"
    )


class SignCompression(UpdateDefense[SignSettings]):
    """Replaces every coordinate by its sign, optionally times its tensor's mean magnitude."""

    def apply(self, update: ClientUpdate, generator: torch.Generator) -> ClientUpdate:
        tensors = {}
        for key, tensor in update.tensors.items():
            signs = torch.sign(tensor)
            if self.settings.scale == "mean" and tensor.numel() > 0:
                signs = signs * tensor.abs().mean()
            tensors[key] = signs
        return ClientUpdate(kind=update.kind, tensors=tensors, metadata=dict(update.metadata))
