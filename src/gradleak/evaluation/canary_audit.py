"""Canaries inside a federated fine-tuning, and the epsilon their scores measure per round and
over the run (:mod:`gradleak.evaluation.privacy_audit`).

Canary clients (:mod:`gradleak.federated.canaries`): each round the inserted ones join the
real clients' updates (through the same per-update defenses a client applies) and the round's
canaries are scored against the aggregate. Canary records
(:mod:`gradleak.federated.canary_records`): the inserted ones join their clients' batches, and
the round's records are scored by their own gradients against the aggregate."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gradleak.data import Example
from gradleak.defenses.base import Defense, SampleDefense, UpdateDefense
from gradleak.defenses.chain import apply_update_defenses
from gradleak.errors import GradleakError
from gradleak.evaluation.privacy_audit import EmpiricalEpsilon, empirical_epsilon
from gradleak.federated.canaries import CanaryClients, draw_buffers, tensors_norm
from gradleak.federated.canary_records import CanaryRecords
from gradleak.federated.client import GlobalModel, fedsgd_gradient
from gradleak.federated.payload import UpdatePayload
from gradleak.models.tasks import EncodedBatch
from gradleak.runtime.seeds import derived_seed

CANARY_DEFENSE_STREAM = 3  # the seed stream of a canary's own per-update defenses
RECORD_SCORE_STREAM = 4  # the seed stream of the dropout masks a record is scored with
RECORDS_A_PASS = 32  # records whose embedding-row gradients one backward pass gives


@dataclass(frozen=True)
class EmpiricalPrivacy:
    """What the canaries of one run measured: per round (None where the round had no canary of
    one kind) and over the whole run. ``kind``: ``clients`` (canary clients, with the norm of
    their update) or ``records`` (canary records, beside the accountant's epsilon of one
    client's round where a DP-SGD defense gives one)."""

    canaries: int
    seed: int
    norm: float | None
    rounds: list[EmpiricalEpsilon | None]
    overall: EmpiricalEpsilon
    kind: str = "clients"
    accountant: float | None = None
    scoring: str = "cosine"  # what scored the canaries: cosine | gradient | reconstruction

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "scoring": self.scoring,
            "canaries": self.canaries,
            "seed": self.seed,
            "norm": self.norm,
            "accountant_epsilon": self.accountant,
            "rounds": [r.as_dict() if r else None for r in self.rounds],
            "overall": self.overall.as_dict(),
        }


def bounds(
    scores: Mapping[int, float], inserted: Sequence[bool], indices: Sequence[int], delta: float
) -> EmpiricalEpsilon | None:
    """The bounds from the scored canaries among ``indices``, the inserted ones' scores
    against the held-out ones' (None until both kinds are scored)."""
    scored = [i for i in indices if i in scores]
    ins = [scores[i] for i in scored if inserted[i]]
    outs = [scores[i] for i in scored if not inserted[i]]
    return empirical_epsilon(ins, outs, delta=delta) if ins and outs else None


def measured(
    scores: Mapping[int, float],
    inserted: Sequence[bool],
    by_round: Sequence[list[int]],
    delta: float,
    what: str,
) -> tuple[list[EmpiricalEpsilon | None], EmpiricalEpsilon]:
    """The bounds of each round (canaries ``by_round[r]``) and of the run."""
    overall = bounds(scores, inserted, list(scores), delta)
    if overall is None:
        raise GradleakError(
            f"the {len(inserted)} {what} are all inserted or all held out: raise their number"
        )
    return [bounds(scores, inserted, indices, delta) for indices in by_round], overall


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

    def round_summary(self, round_index: int) -> EmpiricalEpsilon | None:
        """The bounds of one round's canaries (None until both kinds are scored)."""
        indices = self.canaries.of_round(round_index)
        return bounds(self.scores, self.canaries.inserted, indices, self.delta)

    def result(self) -> EmpiricalPrivacy:
        """The measured epsilon of each round and of the run, from the scores so far."""
        by_round = [self.canaries.of_round(r) for r in range(self.canaries.rounds)]
        rounds, overall = measured(
            self.scores, self.canaries.inserted, by_round, self.delta, "canaries (--canaries)"
        )
        return EmpiricalPrivacy(
            canaries=self.canaries.count,
            seed=self.canaries.seed,
            norm=float(self.norm or 0.0),
            rounds=rounds,
            overall=overall,
        )


class RecordAudit:
    """The canary records of one fine-tuning (:mod:`gradleak.federated.canary_records`) and
    their scores so far: each record of a round, inserted or held out, scored by the cosine of
    its own gradient at the model the round started from with the round's descent direction
    (the mean gradient, or the negative of the mean FedAvg delta): on the embedding rows of
    its own words where the update carries the table whole (no other record's words move
    them much), else on the whole update."""

    def __init__(
        self,
        records: CanaryRecords,
        delta: float = 1e-5,
        accountant: float | None = None,
        scoring: str = "gradient",
    ) -> None:
        self.records, self.delta, self.accountant = records, delta, accountant
        self.scoring = scoring  # gradient (:meth:`score`) | reconstruction (the attacks')
        self.scores: dict[int, float] = {}

    def planted(
        self, round_index: int, batches: Sequence[Sequence[Example]]
    ) -> list[list[Example]]:
        """The round's client batches with each client's inserted records added."""
        return [[*batch, *self.records.planted(round_index, k)] for k, batch in enumerate(batches)]

    def score(
        self,
        round_index: int,
        global_model: GlobalModel,
        aggregate: Mapping[str, torch.Tensor],
        kind: str,
        max_tokens: int | None,
    ) -> None:
        """Score the round's records against ``aggregate`` (an update of ``kind``), at the
        global model before the server steps with it."""
        if not math.isfinite(tensors_norm(aggregate)):
            raise GradleakError(
                f"round {round_index + 1}'s aggregate is not finite: its canary records cannot "
                "be scored"
            )
        sign = -1.0 if kind == "weight_delta" else 1.0
        table = global_model.token_embedding_key()
        indices = self.records.of_round(round_index)
        if table is None or table not in aggregate:  # each record's whole gradient
            for index in indices:
                own = self._gradient(global_model, [index], max_tokens)[0]
                self.scores[index] = sign * _cosine(own, aggregate)
            return
        # The rows of a record's own words: one pass serves a chunk of records, whose rows
        # are (nearly all) their own, random words rarely being shared.
        special = set(global_model.victim.tokenizer.all_special_ids)
        for start in range(0, len(indices), RECORDS_A_PASS):
            chunk = indices[start : start + RECORDS_A_PASS]
            gradient, batch = self._gradient(global_model, chunk, max_tokens)
            for row, index in enumerate(chunk):
                rows = sorted(set(batch.input_ids[row].tolist()) - special)
                own, against = {table: gradient[table][rows]}, {table: aggregate[table][rows]}
                self.scores[index] = sign * _cosine(own, against)

    def _gradient(
        self, global_model: GlobalModel, indices: list[int], max_tokens: int | None
    ) -> tuple[dict[str, torch.Tensor], EncodedBatch]:
        """The plain gradient of the records ``indices`` as one batch, its dropout masks (in
        train mode) drawn from the records' seed; and the batch."""
        batch = global_model.encode([self.records.example(i) for i in indices], max_tokens)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derived_seed(self.records.seed, indices[0], RECORD_SCORE_STREAM))
            return fedsgd_gradient(global_model, batch), batch

    def score_reconstructions(
        self, round_index: int, sentences: Sequence[Sequence[int]], tokenizer: Any
    ) -> None:
        """Score the round's records by what the attacks reconstructed from the round's
        updates (``sentences``: token ids, every attack's, every reply's): 1 where a sentence
        is the record's own ids, else the best unigram F1 of a sentence with them."""
        special = set(tokenizer.all_special_ids)
        found = [[t for t in ids if t not in special] for ids in sentences]
        for index in self.records.of_round(round_index):
            ids = tokenizer(self.records.example(index).text)["input_ids"]
            own = [t for t in ids if t not in special]
            self.scores[index] = max((_unigram_f1(own, s) for s in found), default=0.0)

    def round_summary(self, round_index: int) -> EmpiricalEpsilon | None:
        """The bounds of one round's records (None until both kinds are scored)."""
        indices = self.records.of_round(round_index)
        return bounds(self.scores, self.records.inserted, indices, self.delta)

    def result(self) -> EmpiricalPrivacy:
        """The measured epsilon of each round and of the run, beside the accountant's."""
        by_round = [self.records.of_round(r) for r in range(self.records.rounds)]
        rounds, overall = measured(
            self.scores, self.records.inserted, by_round, self.delta,
            "canary records (--canary-records)",
        )  # fmt: skip
        return EmpiricalPrivacy(
            canaries=self.records.count,
            seed=self.records.seed,
            norm=None,
            rounds=rounds,
            overall=overall,
            kind="records",
            accountant=self.accountant,
            scoring=self.scoring,
        )


def _cosine(first: Mapping[str, torch.Tensor], second: Mapping[str, torch.Tensor]) -> float:
    """The cosine of two sets of tensors (0 where either is zero)."""
    dot = sum(float(torch.vdot(first[k].reshape(-1), second[k].reshape(-1))) for k in first)
    norms = tensors_norm(first) * tensors_norm({k: second[k] for k in first})
    return dot / norms if norms > 0 else 0.0


def _unigram_f1(record: Sequence[int], sentence: Sequence[int]) -> float:
    """1 for the record's own ids, else the F1 of their token multisets."""
    if list(record) == list(sentence):
        return 1.0
    overlap = sum((Counter(record) & Counter(sentence)).values())
    total = len(record) + len(sentence)
    return 2 * overlap / total if total else 0.0
