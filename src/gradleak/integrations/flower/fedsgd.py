"""FedSGD as a Flower strategy: the clients send one gradient each, the server steps.

McMahan et al.'s FedSGD: every sampled client computes the gradient of its batch at the
global weights; the server averages the gradients (weighted by the clients' numbers of
examples, as FedAvg weighs weights) and takes one step of ``server_lr``. Flower's built-in
strategies average weights; this one reuses FedAvg's sampling and weighted mean and applies
the mean as a gradient.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg


class FedSgd(FedAvg):
    """FedAvg's sampling; the aggregate is ``weights - server_lr * mean(gradients)``."""

    def __init__(self, server_lr: float = 1.0, **fedavg: Any) -> None:
        super().__init__(**fedavg)
        if server_lr <= 0:
            raise ValueError("server_lr must be positive")
        self.server_lr = server_lr
        self._current: dict[int, ArrayRecord] = {}

    def __repr__(self) -> str:
        return f"FedSgd(server_lr={self.server_lr})"

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._current[server_round] = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        mean, metrics = super().aggregate_train(server_round, replies)
        current = self._current.pop(server_round)
        if mean is None:
            return None, metrics
        stepped = {}
        for name in current:
            weight = current[name].numpy()
            step = np.asarray(self.server_lr, dtype=weight.dtype) * mean[name].numpy()
            stepped[name] = Array(np.asarray(weight - step.astype(weight.dtype)))
        return ArrayRecord(stepped), metrics
