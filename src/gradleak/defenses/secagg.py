"""Secure aggregation: the server sees only the combination of K clients' updates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gradleak.defenses.base import AcrossClientsDefense
from gradleak.defenses.settings import SecAggSettings
from gradleak.federated.payload import UpdatePayload


class SecureAggregation(AcrossClientsDefense[SecAggSettings]):
    """Sums (or averages) the K updates tensor by tensor, in client order."""

    @property
    def clients(self) -> int:
        return self.settings.clients

    def noise_variance(
        self, variance: float, received: torch.Tensor, metadata: Mapping[str, Any]
    ) -> float:
        """Each client's noise is independent: K of them summed, or averaged."""
        k = self.clients
        return variance * k if self.settings.reduce == "sum" else variance / k

    def combine(self, updates: list[UpdatePayload]) -> UpdatePayload:
        if len(updates) != self.clients:
            raise ValueError(f"secagg expects {self.clients} updates, got {len(updates)}")
        first = updates[0]
        combined = {}
        for key in first.tensors:
            total = torch.stack([u.tensors[key] for u in updates]).sum(dim=0)
            combined[key] = total / len(updates) if self.settings.reduce == "mean" else total
        metadata = {
            **first.metadata,
            "n_samples": sum(u.metadata.get("n_samples", 0) for u in updates),
            "aggregated_clients": len(updates),
            "aggregation": self.settings.reduce,
        }
        return UpdatePayload(kind=first.kind, tensors=combined, metadata=metadata)
