"""A leakage audit inside a Flower federation: a strategy wrapper that attacks the updates the
server receives, then lets the wrapped strategy aggregate them unchanged.

``LeakageAudit(FedAvg(...), attacks=[...], knowledge=ServerModel.build(...))`` is a Flower
``Strategy``. In ``configure_train`` it notes the arrays the server sends; in
``aggregate_train`` it turns each sampled reply into gradleak's :class:`~gradleak.Update` (a
FedAvg delta: the reply's weights minus the sent ones; a FedSGD gradient: the reply's arrays),
runs every attack on it with only what the server knows, scores the reconstruction, and hands
the replies to the wrapped strategy. Where the audit sits among Flower's DP wrappers decides
what it sees (see :data:`WHAT_THE_AUDIT_SEES`).
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
from gradleak.api.update import Update
from gradleak.attacks import ATTACKS, Attack, AttackSettings
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel
from gradleak.federated.protocol import Protocol
from gradleak.integrations.flower.arrays import (
    load_arrays,
    require_whole_model,
    trainable_tensors,
)
from gradleak.models.loading import load_victim
from gradleak.running.recipe import ATTACK_STREAM, derived_seed

# The reply's record with the batch facts a client declares (lengths, labels): LAMP and TAG's
# threat model grants them; a real client sends none unless told to.
FACTS_KEY = "batch-facts"

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


@dataclass
class ServerModel:
    """What the auditing server holds: the global model (rebuilt as the clients build it) and
    which batch facts it takes from the clients' replies."""

    global_model: GlobalModel
    known_lengths: bool = False
    known_labels: bool = False

    @classmethod
    def build(
        cls,
        model: str,
        task: str,
        protocol: Protocol,
        seed: int = 0,
        known_lengths: bool = False,
        known_labels: bool = False,
    ) -> ServerModel:
        """The server's copy of a packaged (or local) ``model`` trained as ``protocol`` says
        (LoRA, frozen embeddings, FedSGD or FedAvg), its LoRA initialization drawn from
        ``seed`` as the clients draw it."""
        require_whole_model(protocol.share)
        victim = load_victim(model, task, seed=seed)
        return cls(GlobalModel.build(victim, protocol, seed=seed), known_lengths, known_labels)


@dataclass(frozen=True)
class AuditSample:
    """Which replies are attacked: ``clients`` per round ("all", or a number drawn with
    ``seed`` among the round's replies) in ``rounds`` (None: every round)."""

    clients: int | Literal["all"] = "all"
    rounds: tuple[int, ...] | None = None
    seed: int = 0

    def pick(self, server_round: int, replies: Sequence[Message]) -> list[Message]:
        if self.rounds is not None and server_round not in self.rounds:
            return []
        ordered = sorted(replies, key=lambda m: m.metadata.src_node_id)
        if self.clients == "all" or self.clients >= len(ordered):
            return ordered
        draw = random.Random(f"{self.seed}:{server_round}")
        return sorted(draw.sample(ordered, self.clients), key=lambda m: m.metadata.src_node_id)


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
            (server_round, int(r.metadata.src_node_id), r.error.reason)
            for r in replies
            if r.has_error()
        ]
        sent = self._sent.pop(server_round, None)
        if sent is not None:
            self.audit_round(server_round, sent, [r for r in replies if not r.has_error()])
        return self.strategy.aggregate_train(server_round, replies)

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
        """Attack the sampled ``replies`` to the arrays ``sent`` in ``server_round``."""
        chosen = self.sample.pick(server_round, replies)
        if not chosen or not self.settings:
            return
        before = load_arrays(self.knowledge.global_model, sent)
        for reply in chosen:
            for attacker in self._prepared():
                entry = self._attack_reply(server_round, reply, before, attacker)
                for scorer in self.scorers:
                    scorer(entry)
                self.entries.append(entry)

    def _prepared(self) -> list[Attack]:
        """The attacks, built and prepared once (LAMP's prior is loaded once per audit)."""
        if self._attackers is None:
            attackers = [ATTACKS.build(s) for s in self.settings]
            for attacker in attackers:
                attacker.prepare()
            self._attackers = attackers
        return self._attackers

    def _attack_reply(
        self, server_round: int, reply: Message, before: dict[str, Any], attacker: Attack
    ) -> AuditEntry:
        node = int(reply.metadata.src_node_id)
        start = time.perf_counter()
        update = None
        try:
            update = self.update_of(reply, before)
            lengths, labels = self._declared(reply)
            found = attack_update(
                attacker,
                self.knowledge.global_model,
                update,
                known_labels=labels,
                known_lengths=lengths,
                seed=derived_seed(self.seed, server_round * 1_000_003 + node % 1_000_003,
                                  ATTACK_STREAM),
            )  # fmt: skip
        except GradleakError as exc:  # this update cannot be attacked so (a missing fact)
            found = Reconstruction(texts=[], refusal=str(exc))
        return AuditEntry(
            round=server_round,
            node=node,
            attack=attacker.name,
            n_samples=(update.n_samples or 0) if update is not None else 0,
            texts=found.texts,
            token_ids=found.token_ids,
            refusal=found.refusal,
            seconds=time.perf_counter() - start,
            pairing=attacker.paper_pairing,
            info=found.info,
        )

    def update_of(self, reply: Message, before: dict[str, Any]) -> Update:
        """The reply as gradleak's update: a FedSGD gradient (the reply's arrays) or a FedAvg
        weight delta (the reply's weights minus the sent ones), with the protocol facts the
        server set and the client's declared number of examples."""
        global_model = self.knowledge.global_model
        protocol = global_model.protocol
        arrays = trainable_tensors(
            global_model, reply.content[self.arrayrecord_key], "the reply's arrays"
        )
        metrics = next(iter(reply.content.metric_records.values()), None)
        n_samples = metrics.get("num-examples") if metrics is not None else None
        if protocol.algorithm == "fedsgd":
            tensors, kind = arrays, "gradient"
        else:
            tensors = {name: arrays[name] - before[name].to(arrays[name].dtype) for name in arrays}
            kind = "weight_delta"
        return Update(
            kind=kind,  # type: ignore[arg-type]
            tensors=tensors,
            task=global_model.task,
            protocol=protocol,
            n_samples=None if n_samples is None else int(n_samples),
        )

    def _declared(self, reply: Message) -> tuple[Any, Any]:
        """The lengths and labels the server is given (False: not known), from the reply's
        declared batch facts when the knowledge says the server has them."""
        facts = reply.content.config_records.get(FACTS_KEY)
        chosen = []
        for wanted, key in ((self.knowledge.known_lengths, "lengths"),
                            (self.knowledge.known_labels, "labels")):  # fmt: skip
            if not wanted:
                chosen.append(False)
            elif facts is None or key not in facts:
                raise GradleakError(
                    f"the server is to know the {key}, and this client declared none: have "
                    f"the clients send them in a '{FACTS_KEY}' ConfigRecord, or set "
                    f"known_{key} False"
                )
            else:
                chosen.append([int(v) for v in facts[key]])
        return chosen[0], chosen[1]
