"""Secure aggregation: the server sees only the combination of K clients' updates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field

from gradleak.defenses.base import AcrossClientsDefense, DefenseSettings
from gradleak.federated.client import ClientUpdate


class SecAggSettings(DefenseSettings):
    description: ClassVar[str] = (
        "secure aggregation over K clients: the server sees only the sum (or mean) of their "
        "updates; the other K-1 clients hold other private examples of the same dataset"
    )

    name: Literal["secagg"] = "secagg"
    clients: int = Field(ge=1, description="K: clients whose updates are combined (1: none)")
    reduce: Literal["sum", "mean"] = Field("sum", description="sum or mean of the updates")


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

    def combine(self, updates: list[ClientUpdate]) -> ClientUpdate:
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
        return ClientUpdate(kind=first.kind, tensors=combined, metadata=metadata)
