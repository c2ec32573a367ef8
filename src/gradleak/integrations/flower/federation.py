"""A whole simulated federation with its leakage audit: ``gradleak flower SETUP.yaml``.

Flower's simulation engine runs the server in this process and the K clients in Ray actors
(``flwr.simulation.run_simulation``; a Ray instance already started is reused). The server
holds the strategy (FedAvg, or :class:`FedSgd`), wrapped in the audit and in the DP wrappers
the setup asks for, in the order that decides what the audit sees; it evaluates the global
model on dev data after every round. Each round's utility and audit entries are written to
the store (``OUT/federation.sqlite``) as soon as the round ends, and passed to ``on_round``.

The simulation's ledger (every client's batch of every round, in plain text: what the
``simulation`` scoring compares reconstructions with) exists only while the run does: in a
folder of its own outside ``OUT``, deleted when the run ends, by an error too, and swept away
by a later run where a kill left it (:func:`~gradleak.integrations.flower.ledger.private_ledger`).
A run that does not score against it writes none. ``keep_private`` keeps it as
``OUT/private.sqlite``; without it a former run's ``OUT/private.sqlite`` is deleted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.clientapp.mod import LocalDpMod, fixedclipping_mod
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
    Strategy,
)
from flwr.simulation import run_simulation

from gradleak.data.sources import load_examples
from gradleak.errors import GradleakError, last_line
from gradleak.evaluation.canary_audit import CanaryAudit, EmpiricalPrivacy, RecordAudit
from gradleak.evaluation.privacy_audit import EmpiricalEpsilon
from gradleak.evaluation.utility import evaluate_model
from gradleak.federated.canaries import CanaryClients
from gradleak.federated.client import GlobalModel
from gradleak.integrations.flower.arrays import load_arrays, model_arrays
from gradleak.integrations.flower.audit import AuditEntry, AuditSample, LeakageAudit, Scorer
from gradleak.integrations.flower.canaries import CANARY_CLIENTS_STREAM, measured_records
from gradleak.integrations.flower.canary_clients import FlowerCanaryClients
from gradleak.integrations.flower.client import build_global_model, client_app
from gradleak.integrations.flower.fedsgd import FedSgd
from gradleak.integrations.flower.ledger import FILE_NAME, Ledger, private_ledger, remove_ledger
from gradleak.integrations.flower.partition import client_partitions
from gradleak.integrations.flower.replies import ServerModel
from gradleak.integrations.flower.scoring import CanaryScorer, SimulationScorer
from gradleak.integrations.flower.setup import FederationSetup, setup_of
from gradleak.integrations.flower.store import FederationStore
from gradleak.reports.federation import round_summary
from gradleak.running.distributed import connect
from gradleak.runtime.seeds import derived_seed
from gradleak.runtime.state import kept_global_state


@dataclass
class RoundResult:
    """One round: the global model's dev metrics after it, and the audit's entries."""

    round: int
    utility: dict[str, float]
    entries: list[AuditEntry]
    seconds: float  # the round's wall time, audit included
    # what the round's measured records showed, by what scored them (gradient, reconstruction)
    privacy: dict[str, EmpiricalEpsilon | None] = field(default_factory=dict)

    @property
    def audit_seconds(self) -> float:
        """Of the round's seconds, the attacks'."""
        return sum(entry.seconds for entry in self.entries)

    @property
    def leakage(self) -> dict[str, dict[str, Any]]:
        """Per attack: exact %, ROUGE-2 and canary recovery over the round's entries."""
        return round_summary([entry.to_dict() for entry in self.entries])


@dataclass
class FederationResult:
    setup: FederationSetup
    rounds: list[RoundResult] = field(default_factory=list)
    initial_utility: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    privacy: list[EmpiricalPrivacy] = field(default_factory=list)  # the records over the run


def run_federation(
    setup: FederationSetup | dict[str, Any],
    out: str | Path | None = None,
    on_round: Callable[[RoundResult], None] | None = None,
    ray_address: str | None = None,
    keep_private: bool = False,
) -> FederationResult:
    """Simulate the federation ``setup`` describes, auditing its rounds; results also go to
    ``out/federation.sqlite`` when ``out`` is given.

    The clients' private batches, which the ``simulation`` scoring compares reconstructions
    with, are kept only while the run lasts and deleted when it ends, by an error too;
    ``keep_private`` keeps them in ``out/private.sqlite`` (every client's batch of every
    round, in plain text; readable by this user only).

    Flower's engine runs the clients on Ray: on the cluster at ``ray_address``, on a Ray
    instance already running in this process (``gradleak.running.distributed``'s), or on a local one
    it starts. Flower shuts Ray down when the simulation ends."""
    setup = setup_of(setup)
    if keep_private and out is None:
        raise GradleakError(
            f"keep_private keeps the clients' batches in OUT/{FILE_NAME}: give out as well"
        )
    if ray_address is not None:
        connect(ray_address)
    partitions = client_partitions(setup)
    folder = _out_folder(out)
    with _ledger(setup, folder, keep_private) as ledger:
        store = FederationStore.new(folder / "federation.sqlite", setup) if folder else None
        server = _Server(setup, ledger, store, on_round)
        mods = _client_mods(setup)
        clients = client_app(setup, partitions, None if ledger is None else str(ledger.path), mods)
        start = time.perf_counter()
        with _quiet_flower():
            run_simulation(
                server_app=server.app(),
                client_app=clients,
                num_supernodes=setup.partition.clients,
                backend_config={
                    "client_resources": {"num_cpus": setup.threads, "num_gpus": 0.0},
                    "init_args": {"include_dashboard": False, "num_cpus": _cpus(setup)},
                },
            )
        if server.error is not None:
            raise server.error
        server.result.seconds = time.perf_counter() - start
        if store is not None:
            store.finish(server.result.seconds)
        return server.result


class _Server:
    """The ServerApp's work, and what it found (the app runs in a thread of Flower's)."""

    def __init__(
        self,
        setup: FederationSetup,
        ledger: Ledger | None,
        store: FederationStore | None,
        on_round: Callable[[RoundResult], None] | None,
    ) -> None:
        self.setup = setup
        self.ledger = ledger
        self.store = store
        self.on_round = on_round
        self.result = FederationResult(setup)
        self.error: BaseException | None = None
        self._round_start = time.perf_counter()

    def app(self) -> ServerApp:
        app = ServerApp()

        @app.main()
        def main(grid: Grid, context: Context) -> None:
            try:
                self.run(grid)
            except BaseException as exc:  # re-raised in the caller's thread
                self.error = exc

        return app

    def run(self, grid: Grid) -> None:
        setup = self.setup
        with kept_global_state(setup.threads):
            global_model = build_global_model(setup)
            knowledge = ServerModel(
                global_model, setup.audit.known_lengths, setup.audit.known_labels
            )
            dev = self._dev_examples()
            audit = LeakageAudit(
                _base_strategy(setup),
                setup.audit.attacks,
                knowledge,
                sample=AuditSample(setup.audit.clients, setup.audit.rounds, setup.seed),
                scorers=self._scorers(global_model),
                seed=setup.seed,
                records=measured_records(setup, global_model),
                canary_clients=_canary_clients(setup),
            )
            strategy = _with_privacy(setup, audit)
            initial = model_arrays(global_model)

            def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
                load_arrays(global_model, arrays)
                utility = (
                    evaluate_model(global_model, setup.task, dev, setup.data.max_tokens)
                    if dev
                    else {}
                )
                self._round_done(server_round, utility, audit)
                return MetricRecord(utility)

            self._round_start = time.perf_counter()
            strategy.start(
                grid=grid, initial_arrays=initial, num_rounds=setup.rounds, evaluate_fn=evaluate
            )

    def _round_done(
        self, server_round: int, utility: dict[str, float], audit: LeakageAudit
    ) -> None:
        if audit.failures:  # a client's error is the run's: Flower would go on without it
            failed_round, node, reason = audit.failures[0]
            raise GradleakError(
                f"the client on node {node} failed in round {failed_round}: {last_line(reason)}"
            )
        if server_round == 0:
            self.result.initial_utility = utility
            if self.store is not None:
                self.store.add_round(0, utility, [], 0.0)
            self._round_start = time.perf_counter()
            return
        entries = [e for e in audit.entries if e.round == server_round]
        now = time.perf_counter()
        clients = audit.canary_clients.audit if audit.canary_clients else None
        measured = [m for m in (clients, audit.records, audit.reconstructed) if m and m.scores]
        result = RoundResult(
            round=server_round,
            utility=utility,
            entries=entries,
            seconds=now - self._round_start,
            privacy={_scoring(m): m.round_summary(server_round - 1) for m in measured},
        )
        self._round_start = now
        self.result.rounds.append(result)
        if server_round == self.setup.rounds:
            self.result.privacy = [m.result() for m in measured]
        if self.store is not None:
            self.store.add_round(server_round, utility, entries, result.seconds, result.privacy)
        if self.on_round is not None:
            self.on_round(result)

    def _dev_examples(self) -> list:
        settings, data = self.setup.utility, self.setup.data
        if settings.dev_examples == 0:
            return []
        return load_examples(data.dataset, data.data_dir, settings.split)[: settings.dev_examples]

    def _scorers(self, global_model: GlobalModel) -> list[Scorer]:
        setup = self.setup
        scorers: list[Scorer] = []
        if setup.audit.scoring == "simulation" and self.ledger is not None:
            scorers.append(SimulationScorer(self.ledger, global_model, setup.data.max_tokens))
        if setup.canaries.records and setup.audit.scoring != "none":
            scorers.append(CanaryScorer(setup.canaries.records, global_model))
        return scorers


def _canary_clients(setup: FederationSetup) -> FlowerCanaryClients | None:
    """The federation's canary clients, drawn from the setup's seed (None without them)."""
    count = setup.canaries.canary_clients
    if not count:
        return None
    canaries = CanaryClients(
        count, setup.rounds, derived_seed(setup.seed, 0, CANARY_CLIENTS_STREAM)
    )
    return FlowerCanaryClients(canaries, setup.protocol.algorithm == "fedsgd", setup.server_lr)


def _scoring(measured: CanaryAudit | RecordAudit) -> str:
    """What scored a measurement's canaries, as the results name it."""
    return "canary clients" if isinstance(measured, CanaryAudit) else f"records, {measured.scoring}"


def _base_strategy(setup: FederationSetup) -> Strategy:
    """FedAvg (or FedSGD) sampling ``fraction`` of the clients; evaluation is the server's."""
    sampling = {
        "fraction_train": setup.fraction,
        "fraction_evaluate": 0.0,
        "min_train_nodes": setup.sampled_clients,
        "min_available_nodes": setup.partition.clients,
    }
    if setup.protocol.algorithm == "fedsgd":
        return FedSgd(server_lr=setup.server_lr, **sampling)
    return FedAvg(**sampling)


def _with_privacy(setup: FederationSetup, audit: LeakageAudit) -> Strategy:
    """The audit inside or outside Flower's DP wrappers, as the setup places it."""
    client, central = setup.privacy.client, setup.privacy.central
    sampled = setup.sampled_clients
    if client is not None and client.kind == "fixed-clipping":
        return DifferentialPrivacyClientSideFixedClipping(
            audit, client.noise_multiplier, client.clip, sampled
        )
    if central is None:
        return audit
    inner = audit.strategy if central.audit == "outside" else audit
    if central.clipping == "adaptive":
        wrapped: Strategy = DifferentialPrivacyServerSideAdaptiveClipping(
            inner, central.noise_multiplier, sampled, initial_clipping_norm=central.clip
        )
    else:
        wrapped = DifferentialPrivacyServerSideFixedClipping(
            inner, central.noise_multiplier, central.clip, sampled
        )
    if central.audit == "outside":
        audit.strategy = wrapped
        return audit
    return wrapped


def _client_mods(setup: FederationSetup) -> list[Any]:
    client = setup.privacy.client
    if client is None:
        return []
    if client.kind == "fixed-clipping":
        return [fixedclipping_mod]
    return [LocalDpMod(client.clip, client.sensitivity, client.epsilon, client.delta)]


def _cpus(setup: FederationSetup) -> int:
    """CPUs for Ray: the machine's, at least one client's threads."""
    return max(setup.threads, os.cpu_count() or 1)


def _out_folder(out: str | Path | None) -> Path | None:
    """``out``, created (None: nothing kept)."""
    if out is None:
        return None
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GradleakError(f"cannot create {path}: {exc.strerror}") from None
    return path


@contextlib.contextmanager
def _ledger(setup: FederationSetup, out: Path | None, keep: bool) -> Iterator[Ledger | None]:
    """The run's ledger: none where nothing scores against it and none is to be kept, kept as
    ``out/private.sqlite`` when asked, else temporary. A former run's ``out/private.sqlite``
    goes unless kept again."""
    if out is not None and not keep:
        remove_ledger(out / FILE_NAME)
    if setup.audit.scoring != "simulation" and not keep:
        yield None
        return
    with private_ledger(out / FILE_NAME if keep and out is not None else None) as ledger:
        yield ledger


@contextlib.contextmanager
def _quiet_flower() -> Iterator[None]:
    """Flower's log lines below errors off for the block (gradleak prints its own)."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
