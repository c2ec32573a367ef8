"""How a per-sample defense (DP-SGD) enters a client's local steps, as the client sees it: the
client asks the defense to attach to the model it differentiates and takes each step's
gradient from it. The defenses implement these (:class:`gradleak.defenses.SampleDefense`); the
client needs no more of them than this."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn


class PrivateGradients(ABC):
    """A model whose gradients a per-sample defense computes, for one client round.

    Made by :meth:`SampleDefense.attach`; a context manager: leaving it removes every trace
    of the defense from the model (hooks, per-example buffers, module flags).
    """

    @abstractmethod
    def gradient(self, example_losses: Callable[[], torch.Tensor], batch_size: int) -> None:
        """Run ``example_losses`` (the forward pass: each example's own loss, shape
        ``[batch_size]``) and leave in every trainable parameter's ``.grad`` the defended
        mean gradient. An optimizer step, if any, is the client's."""

    @abstractmethod
    def close(self) -> None:
        """Detach from the model."""

    def __enter__(self) -> PrivateGradients:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class PrivateSteps(Protocol):
    """A per-sample defense as the client uses it: its stage, and the private gradients it
    makes of a model until closed."""

    stage: str

    def attach(self, model: nn.Module, generator: torch.Generator) -> PrivateGradients: ...


class Staged(Protocol):
    """A defense as the client sorts them: by where it acts (``per_sample`` runs in its steps)."""

    stage: str
