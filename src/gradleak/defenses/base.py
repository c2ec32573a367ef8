"""The defense contract: a client-side transformation of what the client sends.

A defense acts where the mathematics puts it (its ``stage``):

* ``per_update``: on the finished update (Gaussian noise, pruning, sign compression);
* ``per_sample``: inside the client's local steps, on each example's gradient (DP-SGD's
  clipping and noise);
* ``across_clients``: on the sum of several clients' updates (secure aggregation).

The scenario lists its defenses in order; the client applies them in that order; the record
names each with its parameters; the server's knowledge holds the ones declared ``public``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

import torch
from torch import nn

from gradleak.defenses.settings import DefenseSettings
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.private import PrivateGradients

if TYPE_CHECKING:
    from gradleak.federated.client import GlobalModel

Stage = Literal["per_sample", "per_update", "across_clients"]


SettingsT = TypeVar("SettingsT", bound=DefenseSettings)


class Defense(ABC, Generic[SettingsT]):
    """Base class of every defense; subclass one of the stage classes below."""

    stage: ClassVar[Stage]

    def __init__(self, settings: SettingsT) -> None:
        self.settings = settings

    @property
    def name(self) -> str:
        return self.settings.name

    def noise_variance(
        self, variance: float, received: torch.Tensor, metadata: Mapping[str, Any]
    ) -> float:
        """The per-entry variance of the random noise in a tensor after this defense, given
        ``variance`` before it (``received``: the tensor as the server got it; ``metadata``:
        the round's protocol facts the update carries). Lets an attack that knows the public
        defenses size the noise floor of what it receives; a defense that adds or combines no
        noise leaves it unchanged."""
        return variance


class UpdateDefense(Defense[SettingsT]):
    """A defense on the finished update."""

    stage: ClassVar[Stage] = "per_update"

    @abstractmethod
    def apply(self, update: UpdatePayload, generator: torch.Generator) -> UpdatePayload:
        """The defended update; random draws come from ``generator`` only."""

    def apply_rows(
        self, rows: UpdatePayload, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """The defense on N updates at once, each tensor of ``rows`` stacked ``[N, ...]``:
        row ``n`` of the result is what :meth:`apply` gives row ``n``, with the random draws
        in row order. A server that makes many updates (LTI's training pairs) calls this; a
        defense whose rows do not interact vectorizes it (:class:`RowwiseDefense`)."""
        count = next(iter(rows.tensors.values())).shape[0] if rows.tensors else 0
        defended = [self.apply(_row(rows, n), generator).tensors for n in range(count)]
        return {key: torch.stack([d[key] for d in defended]) for key in rows.tensors}


class RowwiseDefense(UpdateDefense[SettingsT]):
    """A per-update defense without random draws, written for a stack of updates
    (:meth:`apply_rows`); one update is a stack of one."""

    def apply(self, update: UpdatePayload, generator: torch.Generator) -> UpdatePayload:
        stacked = {key: t[None] for key, t in update.tensors.items()}
        rows = UpdatePayload(kind=update.kind, tensors=stacked, metadata=update.metadata)
        tensors = {key: t[0] for key, t in self.apply_rows(rows, generator).items()}
        return UpdatePayload(kind=update.kind, tensors=tensors, metadata=dict(update.metadata))

    @abstractmethod
    def apply_rows(
        self, rows: UpdatePayload, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Each row's defended tensors, computed for all rows at once."""


def _row(rows: UpdatePayload, n: int) -> UpdatePayload:
    """Update ``n`` of a stack of updates."""
    tensors = {key: t[n] for key, t in rows.tensors.items()}
    return UpdatePayload(kind=rows.kind, tensors=tensors, metadata=dict(rows.metadata))


class AcrossClientsDefense(Defense[SettingsT]):
    """A defense that combines several clients' updates into what the server sees.

    The run draws ``clients`` - 1 more clients beside the one under attack, each with other
    private examples of the same dataset and the same protocol; per-update defenses listed
    before this one act on each client's update, those listed after it on the combination."""

    stage: ClassVar[Stage] = "across_clients"

    @property
    @abstractmethod
    def clients(self) -> int:
        """How many clients' updates are combined."""

    @abstractmethod
    def combine(self, updates: list[UpdatePayload]) -> UpdatePayload:
        """What the server receives from ``updates`` (the attacked client's first)."""


class SampleDefense(Defense[SettingsT]):
    """A defense inside the client's local steps, on each example's gradient (DP-SGD).

    The client attaches it to the model it differentiates (FedSGD: the global model, for one
    gradient; FedAvg: its local copy, for every local step) and asks it for each step's
    gradient; random draws come from the generator given to :meth:`attach` only.
    """

    stage: ClassVar[Stage] = "per_sample"

    @abstractmethod
    def attach(self, model: nn.Module, generator: torch.Generator) -> PrivateGradients:
        """Make the gradients of ``model``'s trainable parameters private until closed."""

    @abstractmethod
    def facts(self, global_model: GlobalModel, n_samples: int) -> dict[str, Any]:
        """What the defense guarantees for a client round on ``n_samples`` examples (for the
        record, not for the server: epsilon and delta for DP-SGD)."""
