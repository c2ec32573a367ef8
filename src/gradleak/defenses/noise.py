"""Gaussian noise on the update (LAMP Table 5; Wu et al. 2023, Table 2)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from gradleak.defenses.base import UpdateDefense
from gradleak.defenses.settings import NoiseSettings
from gradleak.federated.payload import UpdatePayload
from gradleak.runtime import devices


class GaussianNoise(UpdateDefense[NoiseSettings]):
    """Adds independent N(0, std^2) noise to every entry of every tensor of the update."""

    def noise_variance(
        self, variance: float, received: torch.Tensor, metadata: Mapping[str, Any]
    ) -> float:
        sigma = self.settings.sigma
        if not self.settings.relative:
            return variance + sigma**2
        # relative: std = sigma * RMS of the tensor before the noise, which the received
        # tensor shows inflated by the noise itself: RMS_received^2 = RMS^2 (1 + sigma^2)
        mean_square = float(received.double().pow(2).mean())
        return variance + sigma**2 * mean_square / (1 + sigma**2)

    def apply(self, update: UpdatePayload, generator: torch.Generator) -> UpdatePayload:
        noised = {}
        for key in sorted(update.tensors):  # a fixed order: the same seed draws the same noise
            tensor = update.tensors[key]
            std = self.settings.sigma
            if self.settings.relative:
                std *= float(tensor.norm()) / math.sqrt(max(1, tensor.numel()))
            noise = devices.randn(
                *tensor.shape, generator=generator, dtype=tensor.dtype, device=tensor.device
            )
            noised[key] = tensor + std * noise
        tensors = {key: noised[key] for key in update.tensors}
        return UpdatePayload(kind=update.kind, tensors=tensors, metadata=dict(update.metadata))
