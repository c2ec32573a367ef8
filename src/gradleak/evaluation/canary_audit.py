"""Canary clients inside a federated fine-tuning: each round, the inserted canaries join the
real clients' updates (through the same per-update defenses a client applies), and after the
server's step the round's canaries are scored against the aggregate; the scores give the
measured epsilon of each round and of the whole run (:mod:`gradleak.federated.canaries`,
:mod:`gradleak.evaluation.privacy_audit`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gradleak.defenses.base import Defense, SampleDefense, UpdateDefense
from gradleak.defenses.chain import apply_update_defenses
from gradleak.errors import GradleakError
from gradleak.evaluation.privacy_audit import EmpiricalEpsilon, empirical_epsilon
from gradleak.federated.canaries import CanaryClients, draw_buffers, tensors_norm
from gradleak.federated.payload import UpdatePayload
from gradleak.runtime.seeds import derived_seed

CANARY_DEFENSE_STREAM = 3  # the seed stream of a canary's own per-update defenses


@dataclass(frozen=True)
class EmpiricalPrivacy:
    """What the canary clients of one run measured: per round (None where the round had no
    canary of one kind) and over the whole run."""

    canaries: int
    seed: int
    norm: float
    rounds: list[EmpiricalEpsilon | None]
    overall: EmpiricalEpsilon

    def as_dict(self) -> dict[str, Any]:
        return {
            "canaries": self.canaries,
            "seed": self.seed,
            "norm": self.norm,
            "rounds": [r.as_dict() if r else None for r in self.rounds],
            "overall": self.overall.as_dict(),
        }


def update_norm(update: UpdatePayload) -> float:
    """The L2 norm of all of an update's tensors together."""
    return tensors_norm(update.tensors)


class CanaryAudit:
    """The canary clients of one fine-tuning and their scores so far.

    A canary sends ``norm`` times its direction; without a ``norm``, the median norm of the
    first round's real updates before their per-update defenses, so that a canary is as large
    as a typical client's own update, and the defenses then act on it as on theirs.
    """

    def __init__(
        self,
        canaries: CanaryClients,
        defenses: Sequence[Defense],
        norm: float | None = None,
        delta: float = 1e-5,
    ) -> None:
        sample = [d.name for d in defenses if isinstance(d, SampleDefense)]
        if sample:
            raise GradleakError(
                f"canary clients send a crafted update, which {sample[0]}'s per-sample "
                "clipping and noise (inside a real client's steps) never touch: drop "
                f"--canaries, or {sample[0]} from --defense"
            )
        self.canaries, self.defenses, self.norm, self.delta = canaries, defenses, norm, delta
        self.scores: dict[int, float] = {}

    def round_mean(
        self, round_index: int, updates: list[UpdatePayload], norms: Sequence[float]
    ) -> dict[str, torch.Tensor]:
        """The mean the server takes over the round's (defended) real updates and its
        inserted canaries', each canary defended with its own seed; ``norms``: the real
        updates' before their defenses. The canaries are added one at a time, so memory holds
        one canary's update beside the sum, however many take part."""
        if self.norm is None:
            self.norm = statistics.median(norms)
        with torch.no_grad():
            total = {key: torch.stack([u.tensors[key] for u in updates]).sum(dim=0)
                     for key in updates[0].tensors}  # fmt: skip
            inserted = self.canaries.inserted_in(round_index)
            defended = any(isinstance(d, UpdateDefense) for d in self.defenses)
            into = None if defended else draw_buffers(total)
            for index in inserted:
                if not defended:  # what it sends is its draw scaled: add it in place
                    self.canaries.add_to(total, index, float(self.norm), into)
                    continue
                for key, tensor in self.canary_update(index, updates[0]).tensors.items():
                    total[key] += tensor
            return {key: t.div_(len(updates) + len(inserted)) for key, t in total.items()}

    def canary_update(self, index: int, like: UpdatePayload) -> UpdatePayload:
        """What canary ``index`` sends: its update through the per-update defenses, with the
        canary's own seed."""
        seed = derived_seed(self.canaries.seed, index, CANARY_DEFENSE_STREAM)
        canary = self.canaries.update(index, like, self.norm)
        return apply_update_defenses(canary, self.defenses, torch.Generator().manual_seed(seed))

    def score(self, round_index: int, aggregate: Mapping[str, torch.Tensor]) -> None:
        """Score the round's canaries, inserted and held out, against its aggregate."""
        self.scores.update(self.canaries.scores(round_index, aggregate))

    def result(self) -> EmpiricalPrivacy:
        """The measured epsilon of each round and of the run, from the scores so far."""
        rounds = [self._summary(self.canaries.of_round(r)) for r in range(self.canaries.rounds)]
        overall = self._summary(list(self.scores))
        if overall is None:
            raise GradleakError(
                f"the {self.canaries.count} canaries are all inserted or all held out: "
                "raise --canaries"
            )
        return EmpiricalPrivacy(
            canaries=self.canaries.count,
            seed=self.canaries.seed,
            norm=float(self.norm or 0.0),
            rounds=rounds,
            overall=overall,
        )

    def _summary(self, indices: list[int]) -> EmpiricalEpsilon | None:
        scored = [i for i in indices if i in self.scores]
        ins = [self.scores[i] for i in scored if self.canaries.inserted[i]]
        outs = [self.scores[i] for i in scored if not self.canaries.inserted[i]]
        if not ins or not outs:
            return None
        return empirical_epsilon(ins, outs, delta=self.delta)
