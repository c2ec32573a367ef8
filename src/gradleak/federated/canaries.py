"""Canary clients: clients whose update is a fixed random direction, inserted into a federation
by a seeded fair coin, so that one training run shows how visible one client's update is in
what the server aggregates (Andrew et al., "One-shot empirical privacy estimation for federated
learning", ICLR 2024, arXiv:2302.03098).

Canary i has a direction drawn uniformly on the unit sphere of the update's tensors (a standard
normal vector over all of them, normalized) from its own seed, a fair coin (inserted or held
out) and a round. An inserted canary takes part in its round as a client that sends ``norm``
times its direction; a held-out one never takes part. After the round every canary of the
round, inserted or held out, is scored by the cosine of its direction with the round's
aggregate: in d dimensions a held-out canary's cosine is about N(0, 1/d), and an inserted one
stands out exactly as far as the aggregate shows one client's contribution.

The coins are independent fair coins, drawn before the run and recorded by the seed, and a
score depends on the run's output only: the two assumptions of the one-run bounds of
:mod:`gradleak.evaluation.privacy_audit`.

Where this differs from Andrew et al.: they let canaries be sampled into rounds like the
population's clients and score them against the final model (or, for the all-iterates threat
model, against every round's update). Here each canary belongs to one round, as each real
client of gradleak's fine-tuning does, and is scored against that round's aggregate: the
honest-but-curious server sees every round's aggregate, and one round per canary gives a
per-round measure as well as a whole-run one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from gradleak.errors import GradleakError
from gradleak.federated.payload import UpdatePayload
from gradleak.runtime import devices
from gradleak.runtime.seeds import derived_seed

# Independent streams of the canaries' seed: the coins and the rounds, then one per direction.
COINS_STREAM, ROUNDS_STREAM, DIRECTION_STREAM = 0, 1, 2


@dataclass(frozen=True)
class CanaryClients:
    """``count`` canaries spread evenly over ``rounds`` rounds, drawn from ``seed``."""

    count: int
    rounds: int
    seed: int

    def __post_init__(self) -> None:
        if self.count < 2 or self.rounds < 1:
            raise GradleakError(
                f"canary clients need at least 2 canaries and 1 round, got {self.count} and "
                f"{self.rounds}: raise --canaries"
            )

    @cached_property
    def inserted(self) -> np.ndarray:
        """Each canary's fair coin: True where it takes part in its round."""
        generator = np.random.default_rng([self.seed, COINS_STREAM])
        return generator.random(self.count) < 0.5

    @cached_property
    def round_of(self) -> np.ndarray:
        """Each canary's round (0-based): a seeded shuffle of an even split, independent of the
        coins."""
        generator = np.random.default_rng([self.seed, ROUNDS_STREAM])
        return generator.permutation(np.arange(self.count) % self.rounds)

    def of_round(self, round_index: int) -> list[int]:
        """The canaries (inserted or held out) that belong to round ``round_index``."""
        return [int(i) for i in np.flatnonzero(self.round_of == round_index)]

    def inserted_in(self, round_index: int) -> list[int]:
        """The canaries that take part in round ``round_index``."""
        return [i for i in self.of_round(round_index) if self.inserted[i]]

    def direction(self, index: int, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Canary ``index``'s unit direction over tensors shaped, typed and placed as ``like``
        (drawn in the keys' sorted order, so the same on every device)."""
        drawn, norm = self._drawn(index, like)
        return {key: drawn[key].div_(norm) for key in like}

    def _drawn(
        self,
        index: int,
        like: Mapping[str, torch.Tensor],
        into: dict[str, torch.Tensor] | None = None,
    ) -> tuple[dict[str, torch.Tensor], float]:
        """Canary ``index``'s standard normal draws shaped as ``like``, and their norm. With
        ``into`` (CPU tensors shaped as ``like``) the draws fill them: the same numbers as
        fresh tensors, without allocating a model-sized tensor for every canary."""
        generator = torch.Generator().manual_seed(derived_seed(self.seed, index, DIRECTION_STREAM))
        drawn = {}
        for key in sorted(like):
            if into is None:
                shape, where, dtype = like[key].shape, like[key].device, like[key].dtype
                drawn[key] = devices.randn(*shape, generator=generator, device=where, dtype=dtype)
            else:
                drawn[key] = into[key].normal_(generator=generator)
        return drawn, tensors_norm(drawn)

    def update(self, index: int, like: UpdatePayload, norm: float) -> UpdatePayload:
        """What canary ``index`` sends: ``norm`` times its direction, of ``like``'s kind, with
        its metadata (the round's protocol facts)."""
        tensors = {key: norm * t for key, t in self.direction(index, like.tensors).items()}
        return UpdatePayload(kind=like.kind, tensors=tensors, metadata=dict(like.metadata))

    def add_to(
        self,
        total: dict[str, torch.Tensor],
        index: int,
        norm: float,
        into: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Add what canary ``index`` sends (:meth:`update`, undefended) to ``total`` in place,
        drawing into ``into`` (see :meth:`scores`) where given."""
        drawn, size = self._drawn(index, total, into)
        for key, tensor in drawn.items():
            total[key].add_(tensor, alpha=norm / size)

    def scores(self, round_index: int, aggregate: Mapping[str, torch.Tensor]) -> dict[int, float]:
        """The cosine of each of the round's canaries' direction with ``aggregate`` (the mean
        update the server applies), inserted and held out alike."""
        size = tensors_norm(aggregate)
        if size == 0 or not math.isfinite(size):
            what = "zero" if size == 0 else "not finite"
            raise GradleakError(
                f"round {round_index + 1}'s aggregate is {what}: its canaries cannot be scored"
            )
        into = draw_buffers(aggregate)
        found = {}
        for index in self.of_round(round_index):
            drawn, norm = self._drawn(index, aggregate, into)
            found[index] = sum(_dot(drawn[k], aggregate[k]) for k in drawn) / (norm * size)
        return found


def draw_buffers(like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """Tensors shaped as ``like`` that the canaries' draws can fill one canary after another
    (on the CPU only, where the draws are made), or None."""
    if any(t.device.type != "cpu" for t in like.values()):
        return None
    return {key: torch.empty_like(t) for key, t in like.items()}


def tensors_norm(tensors: Mapping[str, torch.Tensor]) -> float:
    """The L2 norm of all of ``tensors`` together."""
    return math.sqrt(sum(_dot(t, t) for t in tensors.values()))


def _dot(first: torch.Tensor, second: torch.Tensor) -> float:
    """The dot product of two tensors of one shape, as a Python float."""
    return float(torch.dot(first.reshape(-1), second.reshape(-1)))
