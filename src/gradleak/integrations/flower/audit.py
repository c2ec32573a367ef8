"""A leakage audit inside a Flower federation: a strategy wrapper that attacks the updates the
server receives, then lets the wrapped strategy aggregate them unchanged.

``LeakageAudit(FedAvg(...), attacks=[...], knowledge=ServerModel.build(...))`` is a Flower
``Strategy``. In ``configure_train`` it notes the arrays the server sends; in
``aggregate_train`` it turns each sampled reply into gradleak's :class:`~gradleak.Update` (a
FedAvg delta: the reply's weights minus the sent ones; a FedSGD gradient: the reply's arrays),
runs every attack on it with only what the server knows, scores the reconstruction, and hands
the replies to the wrapped strategy. Where the audit sits among Flower's DP wrappers decides
what it sees (see :data:`WHAT_THE_AUDIT_SEES`).

Nothing a client sends is trusted. Each reply is checked where the audit first reads it: its
node id (:func:`node_of`), its arrays (names, shapes, dtypes and finite values against the
server's model: :func:`~gradleak.integrations.flower.arrays.reply_tensors`), its
``num-examples`` (a whole number, 1 to :data:`MAX_EXAMPLES`) and the batch facts the server
takes from it (one length or label per example, each a whole number within the model's
limits). A reply that fails a check, or that is an error instead of content, is an
:class:`AuditEntry` refused with a one-line reason, and the round goes on.

The audit observes; it does not change the federation's training. Every reply, malformed or
not, is handed to the wrapped strategy unchanged and in the order received, so the aggregate
is what that strategy makes of the same replies, bit for bit: Flower's strategy decides what
a malformed reply does to the round (FedAvg skips an error reply, weighs a reply by whatever
``num-examples`` it declares, and raises on arrays it cannot average, as it would without the
audit).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from gradleak.api import Reconstruction, attack_update
from gradleak.attacks import ATTACKS, Attack, AttackSettings
from gradleak.errors import GradleakError
from gradleak.evaluation.canary_audit import RecordAudit
from gradleak.federated.canary_records import CanaryRecords
from gradleak.integrations.flower.arrays import load_arrays, record_of, trainable_tensors
from gradleak.integrations.flower.canary_clients import FlowerCanaryClients
from gradleak.integrations.flower.replies import (
    Received,
    ServerModel,
    entry_node,
    node_order,
    reason_line,
    received,
)
from gradleak.running.recipe import ATTACK_STREAM, derived_seed

# Where the audit sits, and what a curious server running it sees (tests/integration/test_flower.py
# runs each row).
WHAT_THE_AUDIT_SEES = {
    "Audit(FedAvg)": "each client's update as sent",
    "Audit(FedAvg), clients with LocalDpMod": "each update clipped and noised by its client",
    "DPClientSideFixedClipping(Audit(FedAvg)), clients with fixedclipping_mod": "each update "
    "clipped by its client, before the server's noise",
    "DPServerSideFixedClipping(Audit(FedAvg))": "each update clipped, not yet noised: what a "
    "curious server sees behind its own central DP",
    "DPServerSideAdaptiveClipping(Audit(FedAvg))": "each update clipped at the round's "
    "adaptive norm, not yet noised",
    "Audit(DPServerSideFixedClipping(FedAvg))": "each update as sent, before the server clips "
    "it: central DP does not protect a client from the server that applies it",
}


@dataclass(frozen=True)
class AuditSample:
    """Which replies are attacked: ``clients`` per round ("all", or a number drawn with
    ``seed`` among the round's replies, errors and malformed ones included: those drawn are
    entries refused) in ``rounds`` (None: every round)."""

    clients: int | Literal["all"] = "all"
    rounds: tuple[int, ...] | None = None
    seed: int = 0

    def pick(self, server_round: int, replies: Sequence[Message]) -> list[Message]:
        if self.rounds is not None and server_round not in self.rounds:
            return []
        ordered = sorted(replies, key=node_order)
        if self.clients == "all" or self.clients >= len(ordered):
            return ordered
        draw = random.Random(f"{self.seed}:{server_round}")
        return sorted(draw.sample(ordered, self.clients), key=node_order)


@dataclass
class AuditEntry:
    """One attack on one client's update of one round, and how much it recovered.

    ``scoring`` says what the scores compare with: ``simulation`` (the client's private batch,
    through the simulation's side channel), ``canaries`` (the planted records), both
    (``simulation+canaries``) or ``none``; ``scores`` holds each by that name.
    """

    round: int
    node: int
    attack: str
    n_samples: int
    texts: list[str]
    token_ids: list[list[int]]
    refusal: str | None
    seconds: float
    # how the attack's paper pairs predictions with references (its paper-compatible scores)
    pairing: str = "matched"
    scores: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def scoring(self) -> str:
        scored = [name for name, value in self.scores.items() if value is not None]
        return "+".join(scored) or "none"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "scoring": self.scoring}


# A scorer adds scores to an entry once the attack has returned: (entry) -> None.
Scorer = Callable[[AuditEntry], None]


class LeakageAudit(Strategy):
    """A Flower strategy that audits the updates it receives, then aggregates as ``strategy``.

    ``attacks``: attack names or settings (``"dager"``, ``ATTACKS.settings("tag", steps=500)``);
    ``knowledge``: the server's model and facts; ``sample``: which replies to attack;
    ``scorers``: called on each entry after its attack (the simulation's ledger, the
    canaries); ``entries`` holds every finished entry. ``protocol`` is
    read from the knowledge's global model: FedSGD replies are gradients, FedAvg replies are
    weights. The aggregate is the wrapped strategy's, bit for bit.
    """

    def __init__(
        self,
        strategy: Strategy,
        attacks: Sequence[str | AttackSettings],
        knowledge: ServerModel,
        sample: AuditSample | None = None,
        scorers: Sequence[Scorer] = (),
        arrayrecord_key: str = "arrays",
        seed: int = 0,
        records: CanaryRecords | None = None,
        canary_clients: FlowerCanaryClients | None = None,
    ) -> None:
        super().__init__()
        self.strategy = strategy
        self.settings = [
            a if isinstance(a, AttackSettings) else ATTACKS.settings(a) for a in attacks
        ]
        self.knowledge = knowledge
        self.sample = sample or AuditSample(seed=seed)
        self.scorers = list(scorers)
        self.arrayrecord_key = arrayrecord_key
        self.seed = seed
        self.entries: list[AuditEntry] = []
        # (round, node, reason) of the replies that were errors (a client that failed)
        self.failures: list[tuple[int, int, str]] = []
        self._attackers: list[Attack] | None = None
        self._sent: dict[int, ArrayRecord] = {}
        # the measured canary records the clients plant, scored against each round's change,
        # and by what the attacks reconstructed of the round
        self.records = None if records is None else RecordAudit(records)
        self.reconstructed = (
            None if records is None else RecordAudit(records, scoring="reconstruction")
        )
        self.canary_clients = canary_clients  # mixed into each round's aggregate and scored

    def __repr__(self) -> str:
        return f"LeakageAudit({self.strategy!r})"

    # --- the wrapped strategy's work, unchanged ---------------------------------------------

    def summary(self) -> None:
        self.strategy.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._sent[server_round] = arrays
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)  # an iterable: read once, by the audit and the strategy
        self.failures += [
            (server_round, entry_node(r), str(r.error.reason or "no reason given"))
            for r in replies
            if r.has_error()
        ]
        sent = self._sent.pop(server_round, None)
        if sent is not None:
            self.audit_round(server_round, sent, replies)
        # every reply, malformed or not, as received: the aggregate is the strategy's own
        aggregated, metrics = self.strategy.aggregate_train(server_round, replies)
        measuring = self.canary_clients is not None or self.records is not None
        if measuring and sent is not None and aggregated is not None:
            aggregated = self.measure_round(server_round, sent, aggregated, replies)
        if self.reconstructed is not None and self.settings:
            sentences = [
                ids for e in self.entries if e.round == server_round for ids in e.token_ids
            ]
            tokenizer = self.knowledge.global_model.victim.tokenizer
            self.reconstructed.score_reconstructions(server_round - 1, sentences, tokenizer)
        return aggregated, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    # --- the audit ---------------------------------------------------------------------------

    def audit_round(self, server_round: int, sent: ArrayRecord, replies: list[Message]) -> None:
        """Attack the sampled ``replies`` to the arrays ``sent`` in ``server_round``; a reply
        that cannot be attacked (an error, or content that fails a check) is an entry refused
        with its reason, for each attack."""
        chosen = self.sample.pick(server_round, replies)
        if not chosen or not self.settings:
            return
        attackers = self._prepared()
        before: dict[str, Any] | None = None
        unusable = ""
        try:
            before = load_arrays(self.knowledge.global_model, sent)
        except GradleakError as exc:  # the strategy's own arrays (a poisoned aggregate)
            unusable = f"the arrays sent in round {server_round} do not fit the model: {exc}"
        for reply in chosen:
            try:
                if before is None:
                    raise GradleakError(unusable)
                checked: Received | str = received(
                    reply, self.knowledge, self.arrayrecord_key, before
                )
            except GradleakError as exc:
                checked = reason_line(str(exc))
            for attacker in attackers:
                if isinstance(checked, str):
                    entry = self._refused(server_round, reply, attacker, checked)
                else:
                    entry = self._attack_reply(server_round, checked, attacker)
                for scorer in self.scorers:
                    scorer(entry)
                self.entries.append(entry)

    def measure_round(
        self, server_round: int, sent: ArrayRecord, aggregated: ArrayRecord, replies: list[Message]
    ) -> ArrayRecord:
        """The round's canaries: the canary clients mixed into ``aggregated`` (the arrays the
        model goes on with, returned), then the measured records scored against the round's
        descent direction (the arrays ``sent`` less the new ones: a FedAvg mean delta's
        negative, FedSGD's mean gradient times the server's rate) at the model the round
        started from. Each of the two records is read once."""
        gm = self.knowledge.global_model
        before = load_arrays(gm, sent)  # the model the records' gradients are taken at
        after = trainable_tensors(gm, aggregated)
        if self.canary_clients is not None:
            after = self.canary_clients.mixed(
                server_round - 1, gm, before, after, replies, self.arrayrecord_key
            )
            aggregated = record_of(after)
        if self.records is not None:
            descent = {s.key: s.take(before[s.param] - after[s.param]) for s in gm.specs}
            self.records.score(server_round - 1, gm, descent, "gradient", None)
        return aggregated

    def _prepared(self) -> list[Attack]:
        """The attacks, built and prepared once (LAMP's prior is loaded once per audit)."""
        if self._attackers is None:
            attackers = [ATTACKS.build(s) for s in self.settings]
            for attacker in attackers:
                attacker.prepare()
            self._attackers = attackers
        return self._attackers

    def _attack_reply(self, server_round: int, received: Received, attacker: Attack) -> AuditEntry:
        node, update = received.node, received.update
        start = time.perf_counter()
        try:
            found = attack_update(
                attacker,
                self.knowledge.global_model,
                update,
                known_labels=received.labels,
                known_lengths=received.lengths,
                seed=derived_seed(self.seed, server_round * 1_000_003 + node % 1_000_003,
                                  ATTACK_STREAM),
            )  # fmt: skip
        except GradleakError as exc:  # this update cannot be attacked so (facts that disagree)
            found = Reconstruction(texts=[], refusal=reason_line(str(exc)))
        return AuditEntry(
            round=server_round,
            node=node,
            attack=attacker.name,
            n_samples=update.n_samples or 0,
            texts=found.texts,
            token_ids=found.token_ids,
            refusal=found.refusal,
            seconds=time.perf_counter() - start,
            pairing=attacker.paper_pairing,
            info=found.info,
        )

    def _refused(
        self, server_round: int, reply: Message, attacker: Attack, reason: str
    ) -> AuditEntry:
        """The entry of a reply the audit could not attack (node -1: no node id to name)."""
        return AuditEntry(
            round=server_round,
            node=entry_node(reply),
            attack=attacker.name,
            n_samples=0,
            texts=[],
            token_ids=[],
            refusal=reason,
            seconds=0.0,
            pairing=attacker.paper_pairing,
        )
