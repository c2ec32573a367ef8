"""gradleak's Flower client: fine-tunes the federation's model (peft LoRA where the protocol
says) on its partition, one round per train message, with gradleak's own client round (so an
update computed here equals the one ``gradleak.client_update`` computes on the same batch).

Each round the client draws ``batch_size`` examples of its partition (a planting client puts
its canaries first), runs the protocol's round on them, and replies with an ``ArrayRecord``
(FedSGD: the gradient; FedAvg: its weights after local training) and a ``MetricRecord`` with
``num-examples``. It declares its batch's lengths and labels in a ``batch-facts``
ConfigRecord only where the setup grants the server that knowledge. In a simulation it writes
the batch to the ledger, the evaluator's side channel.
"""

from __future__ import annotations

import random
from typing import Any

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from gradleak.data import Example
from gradleak.defenses.round import defended_update
from gradleak.federated.canary_records import CanaryRecords
from gradleak.federated.client import GlobalModel
from gradleak.integrations.flower.arrays import load_arrays, record_of, trainable
from gradleak.integrations.flower.canaries import measured_records, planted
from gradleak.integrations.flower.ledger import Ledger
from gradleak.integrations.flower.replies import FACTS_KEY
from gradleak.integrations.flower.setup import FederationSetup
from gradleak.models.loading import load_victim
from gradleak.models.tasks import EncodedBatch
from gradleak.running.recipe import CLIENT_STREAM, DEFENSE_STREAM, derived_seed
from gradleak.runtime.state import kept_global_state


def build_global_model(setup: FederationSetup) -> GlobalModel:
    """The federation's model as every party builds it: the packaged weights, the head and the
    LoRA adapters drawn from the setup's seed (then overwritten by the round's arrays)."""
    victim = load_victim(setup.model, setup.task, seed=setup.seed)
    return GlobalModel.build(victim, setup.protocol, seed=setup.seed)


def round_batch(
    setup: FederationSetup, examples: list[Example], server_round: int, partition: int
) -> list[Example]:
    """The examples client ``partition`` trains on in ``server_round``: its canaries for the
    round (if it plants them), then examples of its own drawn with the seed."""
    canaries = setup.canaries
    own = []
    if canaries.records and partition in canaries.clients:
        own = planted(canaries.records, server_round, canaries.per_round)[: setup.batch_size]
    draw = random.Random(f"{setup.seed}:{server_round}:{partition}")
    wanted = min(setup.batch_size - len(own), len(examples))
    return own + draw.sample(examples, wanted)


class FederatedClient:
    """One client's work; the model is built on first use in the process that runs it (each
    of Flower's simulation actors builds its own once)."""

    def __init__(
        self, setup: FederationSetup, partitions: list[list[Example]], ledger: str | None
    ) -> None:
        self.setup = setup
        self.partitions = partitions
        self.ledger = None if ledger is None else Ledger(ledger)
        self._global_model: GlobalModel | None = None
        self._records: CanaryRecords | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_global_model": None, "_records": None}  # actors build theirs

    @property
    def global_model(self) -> GlobalModel:
        if self._global_model is None:
            with kept_global_state():
                self._global_model = build_global_model(self.setup)
                self._records = measured_records(self.setup, self._global_model)
        return self._global_model

    def train(self, message: Message, context: Context) -> Message:
        setup = self.setup
        server_round = int(message.content["config"]["server-round"])
        partition = int(context.node_config["partition-id"])
        batch_examples = round_batch(setup, self.partitions[partition], server_round, partition)
        with kept_global_state(setup.threads):
            global_model = self.global_model
            if self._records is not None:  # the inserted measured records of its round
                batch_examples += self._records.planted(server_round - 1, partition)
            load_arrays(global_model, message.content["arrays"])
            batch = global_model.encode(batch_examples, setup.data.max_tokens)
            index = server_round * setup.partition.clients + partition
            seeds = (
                derived_seed(setup.seed, index, CLIENT_STREAM),
                derived_seed(setup.seed, index, DEFENSE_STREAM),
            )
            update = defended_update(global_model, batch, (), seeds)
            if update.kind == "gradient":
                sent = update.tensors
            else:  # the weights after local training: the sent ones plus the round's delta
                sent = {
                    name: param.detach() + update.tensors[name].to(param.dtype)
                    for name, param in trainable(global_model).items()
                }
        if self.ledger is not None:
            self.ledger.write(server_round, context.node_id, partition, batch_examples)
        metrics = MetricRecord({"num-examples": len(batch_examples)})
        content = RecordDict({"arrays": record_of(sent), "metrics": metrics})
        facts = self._declared_facts(batch)
        if facts:
            content[FACTS_KEY] = ConfigRecord(facts)
        return Message(content, reply_to=message)

    def _declared_facts(self, batch: EncodedBatch) -> dict[str, list[int]]:
        """The batch facts this client declares to the server (as the setup grants)."""
        audit, facts = self.setup.audit, {}
        if audit.known_lengths:
            facts["lengths"] = list(batch.lengths)
        if audit.known_labels and "label" in (batch.labels or {}):
            facts["labels"] = [int(v) for v in batch.labels["label"].tolist()]
        return facts


def client_app(
    setup: FederationSetup,
    partitions: list[list[Example]],
    ledger: str | None = None,
    mods: list[Any] | None = None,
) -> ClientApp:
    """A Flower ``ClientApp`` of gradleak's clients: client ``i`` (``partition-id`` in its node
    config) holds ``partitions[i]``; ``ledger``: the side channel's file (simulations only);
    ``mods``: Flower's client mods (``fixedclipping_mod``, ``LocalDpMod``)."""
    client = FederatedClient(setup, partitions, ledger)
    app = ClientApp(mods=mods or [])

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return client.train(message, context)

    return app
