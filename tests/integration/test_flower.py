"""The Flower integration: the audit wrapper, gradleak's Flower clients, Flower's DP in both
orders, canaries, the setup file, and real simulations (Flower's engine on a local Ray).

Most tests drive the strategies with an in-process grid (each message handed straight to the
ClientApp, mods included): the same strategy code as in a simulation, without Ray's start-up.
Two tests run ``run_simulation`` itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

flwr = None
if os.environ.get("GRADLEAK_REQUIRE_FLOWER") == "1":
    import flwr  # noqa: F811  (CI: the extra must be installed; its absence fails)
else:
    flwr = pytest.importorskip(
        "flwr", reason="the flower extra is not installed: pip install 'gradleak[flower]'"
    )

from flwr.app import Context, RecordDict  # noqa: E402
from flwr.serverapp.strategy import (  # noqa: E402
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)

import gradleak  # noqa: E402
from gradleak.attacks import Plan, Reconstruction  # noqa: E402
from gradleak.errors import GradleakError  # noqa: E402
from gradleak.integrations.flower import (  # noqa: E402
    AuditSample,
    FedSgd,
    LeakageAudit,
    ServerModel,
    client_app,
    run_federation,
)
from gradleak.integrations.flower.arrays import model_arrays  # noqa: E402
from gradleak.integrations.flower.canaries import canary_scores, planted  # noqa: E402
from gradleak.integrations.flower.client import build_global_model, round_batch  # noqa: E402
from gradleak.integrations.flower.federation import _client_mods  # noqa: E402
from gradleak.integrations.flower.ledger import Ledger  # noqa: E402
from gradleak.integrations.flower.partition import client_partitions  # noqa: E402
from gradleak.integrations.flower.scoring import CanaryScorer, SimulationScorer  # noqa: E402
from gradleak.integrations.flower.setup import Canary, load_setup, setup_of  # noqa: E402

PIN = "My card PIN is 4921, please do not share it."


class InProcessGrid:
    """A grid whose nodes are ``app`` called in this process: node i holds partition i."""

    def __init__(self, app, clients: int) -> None:
        self.app = app
        self.nodes = {1000 + i: i for i in range(clients)}

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for message in messages:
            node = message.metadata.dst_node_id
            config = {"partition-id": self.nodes[node], "num-partitions": len(self.nodes)}
            context = Context(
                run_id=1, node_id=node, node_config=config, state=RecordDict(), run_config={}
            )
            replies.append(self.app(message, context))
        return replies


@pytest.fixture(autouse=True)
def _server_identity(monkeypatch):
    """Flower stamps a message with the identity of the process's task, which its runtimes
    set; the in-process grid plays the server's part, so the tests set it."""
    from flwr.supercore.task_identity import TaskIdentity

    for attribute, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, attribute, value)


def tiny_setup(**changes):
    base = {
        "model": "tiny-bert",
        "rounds": 1,
        "batch_size": 2,
        "partition": {"clients": 2},
        "protocol": {"algorithm": "fedavg", "mode": "eval", "lr": 0.05},
        "utility": {"dev_examples": 0},
    }
    for key, value in changes.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) and key in base else value
    return setup_of(base)


@dataclass
class Seen:
    update: object
    knowledge: object


class SpyAttack:
    """Stands in for an attack: records what it is handed, reconstructs nothing."""

    name = "spy"
    paper_pairing = "matched"

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.calls: list[str] = []

    def check(self, update, knowledge):
        return Plan()

    def run(self, update, knowledge, plan, seed):
        self.seen.append(Seen(update, knowledge))
        self.calls.append("attack")
        return Reconstruction(token_ids=[])


def audited(setup, strategy_of, ledger=None, spy=None):
    """Run ``setup``'s rounds in process with the audit placed by ``strategy_of(audit)``;
    the audit's attack is a spy. Returns (audit, spy, final arrays)."""
    global_model = build_global_model(setup)
    audit = LeakageAudit(
        FedSgd(server_lr=setup.server_lr, fraction_evaluate=0.0, min_available_nodes=2)
        if setup.protocol.algorithm == "fedsgd"
        else FedAvg(fraction_evaluate=0.0, min_available_nodes=2),
        ["dager"],
        ServerModel(global_model, setup.audit.known_lengths, setup.audit.known_labels),
        scorers=[SimulationScorer(ledger, global_model)] if ledger else [],
    )
    spy = spy or SpyAttack()
    audit._attackers = [spy]
    app = client_app(
        setup,
        client_partitions(setup),
        None if ledger is None else str(ledger.path),
        _client_mods(setup),
    )
    strategy = strategy_of(audit)
    result = strategy.start(
        grid=InProcessGrid(app, setup.partition.clients),
        initial_arrays=model_arrays(global_model),
        num_rounds=setup.rounds,
    )
    return audit, spy, result.arrays


def standalone_fedsgd(model, tokenizer, batch):
    """The eval-mode FedSGD update gradleak computes for ``batch`` outside any federation."""
    texts, labels = [e.text for e in batch], [e.label for e in batch]
    return gradleak.client_update(model, tokenizer, texts, labels, protocol="fedsgd", mode="eval")


def delta_norms(spy) -> list[float]:
    return [
        float(torch.sqrt(sum((t.double() ** 2).sum() for t in seen.update.tensors.values())))
        for seen in spy.seen
    ]


# --- the audit wrapper ----------------------------------------------------------------------


def test_the_aggregate_is_bit_identical_with_and_without_the_audit():
    setup = tiny_setup(rounds=2)
    global_model = build_global_model(setup)
    app = client_app(setup, client_partitions(setup))
    plain = FedAvg(fraction_evaluate=0.0, min_available_nodes=2).start(
        grid=InProcessGrid(app, 2), initial_arrays=model_arrays(global_model), num_rounds=2
    )
    audit, spy, arrays = audited(setup, lambda audit: audit)
    assert len(spy.seen) == 4  # both clients, both rounds
    assert list(arrays.keys()) == list(plain.arrays.keys())
    for name in arrays:
        assert np.array_equal(arrays[name].numpy(), plain.arrays[name].numpy()), name


def test_a_fedavg_reply_becomes_its_weight_delta_and_a_fedsgd_reply_its_gradient():
    setup = tiny_setup(protocol={"algorithm": "fedsgd"}, batch_size=2)
    audit, spy, _ = audited(setup, lambda audit: audit)
    model, tokenizer = gradleak.load_model("tiny-bert", seed=setup.seed)
    partitions = client_partitions(setup)
    # the node of partition 0 is 1000 in the in-process grid: the audited updates come sorted
    first = round_batch(setup, partitions[0], 1, 0)
    standalone = standalone_fedsgd(model, tokenizer, first)
    seen = spy.seen[0].update
    assert seen.kind == "gradient"
    assert set(seen.tensors) == set(standalone.tensors)
    for name, tensor in standalone.tensors.items():
        assert torch.equal(seen.tensors[name], tensor), name


def test_the_attack_sees_only_the_update_and_the_servers_knowledge(tmp_path):
    spy = SpyAttack()
    ledger = SpyLedger(tmp_path / "private.sqlite", spy)
    setup = tiny_setup()
    audit, _, _ = audited(setup, lambda audit: audit, ledger=ledger, spy=spy)
    private = {e.text.lower() for e in round_batch(setup, client_partitions(setup)[0], 1, 0)}
    for seen in spy.seen:
        knowledge = seen.knowledge
        assert knowledge.lengths is None and knowledge.labels is None
        assert knowledge.template_ids is None
        reachable = repr(vars(knowledge)) + repr(seen.update.metadata)
        assert not any(text in reachable.lower() for text in private)
        assert str(ledger.path) not in reachable
    # the side channel is read once per entry, each time after that entry's attack returned
    assert ledger.reads == list(range(1, len(spy.seen) + 1))
    assert all(e.scoring == "simulation" for e in audit.entries)


class SpyLedger(Ledger):
    """A ledger that notes how many attacks had run each time it was read."""

    def __init__(self, path, spy: SpyAttack) -> None:
        super().__init__(path)
        self.spy = spy
        self.reads: list[int] = []

    def read(self, server_round, node):
        self.reads.append(len(self.spy.seen))
        return super().read(server_round, node)


def test_declared_batch_facts_reach_the_attack_only_when_the_server_knows_them():
    setup = tiny_setup(audit={"known_lengths": True, "known_labels": True})
    audit, spy, _ = audited(setup, lambda audit: audit)
    batch = round_batch(setup, client_partitions(setup)[0], 1, 0)
    knowledge = spy.seen[0].knowledge
    assert knowledge.lengths is not None and len(knowledge.lengths) == len(batch)
    assert knowledge.labels["label"].tolist() == [e.label for e in batch]


def test_a_missing_declared_fact_is_the_entrys_refusal():
    setup = tiny_setup()  # the clients declare nothing
    global_model = build_global_model(setup)
    audit = LeakageAudit(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=2),
        ["dager"],
        ServerModel(global_model, known_lengths=True),
    )
    app = client_app(setup, client_partitions(setup))
    audit.start(grid=InProcessGrid(app, 2), initial_arrays=model_arrays(global_model), num_rounds=1)
    assert audit.entries and all("declared none" in e.refusal for e in audit.entries)


def test_the_sample_picks_clients_per_round_with_its_seed():
    setup = tiny_setup(rounds=2, partition={"clients": 3}, fraction=1.0)
    global_model = build_global_model(setup)
    audit = LeakageAudit(
        FedAvg(fraction_evaluate=0.0, min_available_nodes=3),
        ["dager"],
        ServerModel(global_model, setup.audit.known_lengths, setup.audit.known_labels),
        sample=AuditSample(1, rounds=(2,), seed=3),
    )
    spy = SpyAttack()
    audit._attackers = [spy]
    app = client_app(setup, client_partitions(setup))
    audit.start(grid=InProcessGrid(app, 3), initial_arrays=model_arrays(global_model), num_rounds=2)
    assert [(e.round) for e in audit.entries] == [2]


# --- Flower's differential privacy: what the audit sees in each order -----------------------


def raw_norms():
    _, spy, _ = audited(tiny_setup(), lambda audit: audit)
    return delta_norms(spy)


def test_central_dp_inside_the_audit_shows_clipped_unnoised_updates_outside_the_raw_ones():
    raw = raw_norms()
    clip = min(raw) / 4
    setup = tiny_setup(privacy={"central": {"clip": clip, "noise_multiplier": 0.0}})

    def inside(audit):
        return DifferentialPrivacyServerSideFixedClipping(audit, 0.0, clip, 2)

    def outside(audit):
        audit.strategy = DifferentialPrivacyServerSideFixedClipping(audit.strategy, 0.0, clip, 2)
        return audit

    _, spy_in, _ = audited(setup, inside)
    assert delta_norms(spy_in) == pytest.approx([clip, clip], rel=1e-4)
    _, spy_out, _ = audited(setup, outside)
    assert delta_norms(spy_out) == pytest.approx(raw, rel=1e-6)


def test_adaptive_central_clipping_inside_the_audit_shows_updates_at_its_current_norm():
    raw = raw_norms()
    clip = min(raw) / 4
    setup = tiny_setup(
        privacy={"central": {"clipping": "adaptive", "clip": clip, "noise_multiplier": 0.0}}
    )

    def inside(audit):
        return DifferentialPrivacyServerSideAdaptiveClipping(
            audit, 0.0, 2, initial_clipping_norm=clip
        )

    _, spy, _ = audited(setup, inside)
    assert delta_norms(spy) == pytest.approx([clip, clip], rel=1e-4)  # round 1: the initial norm


def test_client_side_clipping_and_local_dp_show_what_the_clients_sent():
    raw = raw_norms()
    clip = min(raw) / 4
    setup = tiny_setup(privacy={"client": {"kind": "fixed-clipping", "clip": clip}})
    _, spy, _ = audited(
        setup, lambda audit: DifferentialPrivacyClientSideFixedClipping(audit, 0.0, clip, 2)
    )
    assert delta_norms(spy) == pytest.approx([clip, clip], rel=1e-4)
    local = tiny_setup(
        privacy={
            "client": {
                "kind": "local-dp",
                "clip": clip,
                "sensitivity": clip,
                "epsilon": 10.0,
                "delta": 1e-5,
            }
        }
    )
    _, spy, _ = audited(local, lambda audit: audit)
    # clipped to clip, then noised: the norm grows well past the clip
    assert all(norm > 2 * clip for norm in delta_norms(spy))


# --- canaries -------------------------------------------------------------------------------


def test_canary_scores_on_known_reconstructions():
    _, tokenizer = gradleak.load_model("tiny-bert")
    canary = Canary(text=PIN, secrets=("4921",))
    ids = tokenizer([PIN, "the spare key is here."])["input_ids"]
    hit = canary_scores([canary], ids, tokenizer)[0]
    assert hit["exact"] and hit["rouge1"] == 100.0 and hit["secrets"] == ["4921"]
    miss_ids = tokenizer(["my card pin is 1111, please share it."])["input_ids"]
    miss = canary_scores([canary], miss_ids, tokenizer)[0]
    assert not miss["exact"] and miss["secrets"] == [] and 50 < miss["rouge1"] < 100


def test_a_planting_client_rotates_its_canaries_through_the_rounds():
    canaries = [Canary(text=f"canary number {i}.") for i in range(3)]
    assert [e.text for e in planted(canaries, 1, 2)] == ["canary number 0.", "canary number 1."]
    assert [e.text for e in planted(canaries, 2, 2)] == ["canary number 2.", "canary number 0."]


def test_a_canary_is_recovered_from_a_live_fedsgd_round():
    setup = tiny_setup(
        protocol={"algorithm": "fedsgd"},
        canaries={"clients": [0], "records": [{"text": PIN, "secrets": ["4921"]}]},
        batch_size=1,
    )
    global_model = build_global_model(setup)
    audit = LeakageAudit(
        FedSgd(fraction_evaluate=0.0, min_available_nodes=2),
        ["dager"],
        ServerModel(global_model, setup.audit.known_lengths, setup.audit.known_labels),
        scorers=[CanaryScorer(setup.canaries.records, global_model)],
    )
    app = client_app(setup, client_partitions(setup))
    audit.start(grid=InProcessGrid(app, 2), initial_arrays=model_arrays(global_model), num_rounds=1)
    scores = [e.scores["canaries"][0] for e in audit.entries]
    assert sum(s["exact"] for s in scores) == 1  # the planting client's, not the other's
    assert any(s["secrets"] == ["4921"] for s in scores)


# --- the setup file -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {
                "protocol": {"algorithm": "fedsgd"},
                "privacy": {"central": {"clip": 1.0, "noise_multiplier": 0.1}},
            },
            "a FedSGD reply is a gradient",
        ),
        ({"canaries": {"records": [{"text": "a b c", "secrets": ["d"]}]}}, "is not in its text"),
        ({"canaries": {"clients": [5], "records": [{"text": "a"}]}}, "partition 5 does not"),
        ({"audit": {"attacks": ["nope"]}}, "nope"),
        ({"audit": {"scoring": "canaries"}}, "needs canaries.records"),
        ({"canaries": {"measured": 8}, "fraction": 0.5}, "use fraction 1"),
        ({"canaries": {"measured": 1}}, "at least 2 records"),
        (
            {
                "canaries": {"canary_clients": 8},
                "privacy": {"central": {"clip": 1.0, "noise_multiplier": 0.1}},
            },
            "drop canary_clients, or privacy",
        ),
    ],
)
def test_a_bad_setup_is_one_line_naming_the_field(changes, message):
    with pytest.raises(GradleakError, match=message) as caught:
        tiny_setup(**changes)
    assert "\n" not in str(caught.value)


def test_a_setup_file_loads_and_a_bad_one_says_where(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(
        "model: tiny-bert\nrounds: 2\naudit:\n  attacks: [dager, {name: tag, steps: 5}]\n"
    )
    setup = load_setup(good)
    assert [a.name for a in setup.audit.attacks] == ["dager", "tag"]
    assert setup.audit.attacks[1].steps == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: 0\n")
    with pytest.raises(GradleakError, match=r"bad.yaml: rounds"):
        load_setup(bad)


def test_partitions_split_all_examples_iid_and_by_label():
    iid = client_partitions(tiny_setup(partition={"clients": 4}))
    assert sorted(len(p) for p in iid) == [4, 4, 4, 4]
    assert len({e.text for p in iid for e in p}) == 16
    skewed = client_partitions(
        tiny_setup(partition={"clients": 2, "scheme": "dirichlet", "alpha": 0.3, "min_examples": 1})
    )
    assert sum(len(p) for p in skewed) == 16
    assert skewed == client_partitions(
        tiny_setup(partition={"clients": 2, "scheme": "dirichlet", "alpha": 0.3, "min_examples": 1})
    )


# --- real simulations (Flower's engine on a local Ray instance) -----------------------------


@pytest.mark.slow
def test_dager_in_a_live_simulation_recovers_a_fedsgd_batch_as_the_standalone_attack(tmp_path):
    """MiniLM, FedSGD, 2 clients with batches of 4, one round under run_simulation: the audit
    recovers each batch exactly, and the same as DAGER on the standalone update."""
    setup = setup_of(
        {
            "model": "minilm",
            "rounds": 1,
            "batch_size": 4,
            "partition": {"clients": 2},
            "protocol": {"algorithm": "fedsgd", "mode": "eval"},
            "audit": {"attacks": ["dager"]},
            "utility": {"dev_examples": 8, "split": "train"},
        }
    )
    result = run_federation(setup, out=tmp_path, keep_private=True)
    entries = result.rounds[0].entries
    assert len(entries) == 2
    model, tokenizer = gradleak.load_model("minilm", seed=setup.seed)
    ledger = Ledger(tmp_path / "private.sqlite")
    for entry in entries:
        batch = ledger.read(1, entry.node)
        assert entry.scores["simulation"]["exact"] == [True] * 4, entry.texts
        update = standalone_fedsgd(model, tokenizer, batch)
        alone = gradleak.invert(
            update, model, tokenizer, "dager", known_labels=False, known_lengths=False
        )
        assert sorted(alone.token_ids) == sorted(entry.token_ids)


@pytest.mark.slow
def test_gradleak_flower_runs_a_setup_file_and_prints_each_round(tmp_path):
    from typer.testing import CliRunner

    from gradleak.cli import app
    from gradleak.reports.federation import read_federation

    setup = tmp_path / "setup.yaml"
    setup.write_text(
        "model: tiny-bert\nrounds: 2\nbatch_size: 2\npartition: {clients: 2}\n"
        "protocol: {algorithm: fedavg, mode: eval, lr: 0.05}\n"
        "audit: {attacks: [dager]}\nutility: {dev_examples: 8, split: train}\n"
        f"canaries: {{clients: [0], records: [{{text: '{PIN}', secrets: ['4921']}}]}}\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["flower", str(setup), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "round 1" in result.output and "round 2" in result.output
    rounds = read_federation(out).rounds
    assert not (out / "private.sqlite").exists()  # the clients' batches went with the run
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(len(r["entries"]) == 2 for r in rounds[1:])
    report = CliRunner().invoke(app, ["report", str(out)])
    assert report.exit_code == 0, report.output
    page = (out / "report.html").read_text()
    assert "Flower federation: tiny-bert on demo, 2 clients, 2 rounds" in page
    assert PIN in page  # the canary's row
    bad = CliRunner().invoke(app, ["flower", str(tmp_path / "missing.yaml")])
    assert bad.exit_code == 2 and "cannot read the setup file" in bad.output


# --- the clients' private batches after a run -----------------------------------------------


def in_process_engine(monkeypatch, after=None) -> list[str]:
    """``run_federation``'s engine replaced by the in-process grid (the same ServerApp and
    ClientApp, without Ray); ``after()`` runs when the server is done. Returns the list that
    receives the path of each run's ledger (as handed to the clients)."""
    import gradleak.integrations.flower.federation as federation

    ledgers: list[str] = []

    def app_of(setup, partitions, ledger=None, mods=None):
        ledgers.append(ledger)
        return client_app(setup, partitions, ledger, mods)

    def run_simulation(server_app, client_app, num_supernodes, backend_config):
        context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
        server_app(InProcessGrid(client_app, num_supernodes), context)
        if after is not None:
            after()

    monkeypatch.setattr(federation, "client_app", app_of)
    monkeypatch.setattr(federation, "run_simulation", run_simulation)
    return ledgers


def texts_in(folder) -> str:
    """Every byte of every file under ``folder``, as lowercase text."""
    return "".join(
        path.read_bytes().decode("latin-1").lower() for path in folder.rglob("*") if path.is_file()
    )


def batch_texts(setup, server_round: int, partition: int) -> list[str]:
    examples = client_partitions(setup)[partition]
    return [e.text.lower() for e in round_batch(setup, examples, server_round, partition)]


def test_no_clients_batch_is_left_in_the_results_folder_after_a_run(tmp_path, monkeypatch):
    ledgers = in_process_engine(monkeypatch)
    setup = tiny_setup(rounds=2, audit={"attacks": ["dager"], "clients": 1})
    out = tmp_path / "out"
    (out).mkdir()
    (out / "private.sqlite").write_text("a former run's batches")  # goes too
    result = run_federation(setup, out=out)
    ledger = ledgers[0]
    assert ledger is not None and not ledger.startswith(str(out))
    assert not os.path.exists(ledger) and not os.path.exists(os.path.dirname(ledger))
    assert sorted(p.name for p in out.iterdir()) == ["federation.sqlite"]
    found = texts_in(out)
    scored, unscored = set(), set()
    for done in result.rounds:
        (entry,) = done.entries  # one client attacked per round, scored against its batch
        assert entry.scores["simulation"] is not None
        scored |= set(batch_texts(setup, done.round, entry.node - 1000))
        unscored |= set(batch_texts(setup, done.round, 1000 + 1 - entry.node))
    # an attacked batch is its entry's reference (the report shows it); the others are nowhere
    assert unscored - scored
    for text in unscored - scored:
        assert text not in found, text


@pytest.mark.parametrize("failure", ["a round's callback raises", "the engine is interrupted"])
def test_no_clients_batch_is_left_after_a_run_that_fails(tmp_path, monkeypatch, failure):
    engine_fails = failure == "the engine is interrupted"

    def interrupted():
        raise KeyboardInterrupt

    ledgers = in_process_engine(monkeypatch, after=interrupted if engine_fails else None)
    attacked = []

    def on_round(result):
        attacked.extend(entry.node - 1000 for entry in result.entries)
        if not engine_fails:
            raise RuntimeError("the operator's callback failed")

    setup = tiny_setup(audit={"attacks": ["dager"], "clients": 1})
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt if engine_fails else RuntimeError):
        run_federation(setup, out=out, on_round=on_round)
    assert ledgers[0] is not None and not os.path.exists(os.path.dirname(ledgers[0]))
    assert not (out / "private.sqlite").exists()
    (partition,) = attacked
    found = texts_in(out)
    for text in batch_texts(setup, 1, 1 - partition):  # the batch nothing was scored against
        assert text not in found, text


def test_the_batches_are_kept_only_when_asked_and_readable_by_their_owner(tmp_path, monkeypatch):
    ledgers = in_process_engine(monkeypatch)
    setup = tiny_setup(audit={"attacks": ["dager"]})
    out = tmp_path / "out"
    run_federation(setup, out=out, keep_private=True)
    kept = out / "private.sqlite"
    assert ledgers == [str(kept)]
    assert (kept.stat().st_mode & 0o777) == 0o600
    ledger = Ledger(kept)
    for partition in (0, 1):
        batch = [e.text.lower() for e in ledger.read(1, 1000 + partition)]
        assert batch == batch_texts(setup, 1, partition)
    run_federation(setup, out=out)  # not asked again: the former run's file goes
    assert not kept.exists()
    with pytest.raises(GradleakError, match="give out") as caught:
        run_federation(setup, keep_private=True)
    assert "\n" not in str(caught.value)


def test_a_run_that_scores_nothing_against_the_batches_writes_none(tmp_path, monkeypatch):
    ledgers = in_process_engine(monkeypatch)
    run_federation(tiny_setup(audit={"attacks": ["dager"], "scoring": "none"}), out=tmp_path)
    assert ledgers == [None]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["federation.sqlite"]


KILLED_RUN = """
import os, signal, sys
from gradleak.data import Example
from gradleak.integrations.flower.ledger import private_ledger
with private_ledger() as ledger:
    ledger.write(1, 7, 0, [Example("my card PIN is 4921", label=0)])
    print(ledger.path, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="kill -9 and advisory locks are POSIX's")
def test_a_ledger_left_by_a_killed_run_is_swept_away_by_the_next(tmp_path, monkeypatch):
    import signal
    import subprocess
    import sys
    import tempfile

    from gradleak.integrations.flower.ledger import private_ledger, sweep

    run = subprocess.run(
        [sys.executable, "-c", KILLED_RUN],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    left = Path(run.stdout.strip()).parent
    assert left.parent == tmp_path and "4921" in texts_in(left)  # nothing ran after the kill
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with private_ledger() as live:
        assert not left.exists()  # the next run's start swept it away
        assert sweep(tmp_path) == []  # and a live run's ledger stays
        assert live.path.exists()
    assert list(tmp_path.iterdir()) == []


def test_measured_records_give_each_rounds_epsilon_in_a_live_federation(tmp_path):
    """Undefended FedAvg, 2 rounds of 2 tiny-bert clients: the inserted measured records are
    in exactly their clients' batches, each round's bound and the run's come out of the
    aggregates alone (every inserted record stands out: the most 64 records can show), and
    the store keeps each round's."""
    import json
    import sqlite3

    from gradleak.integrations.flower.canaries import measured_records

    setup = tiny_setup(rounds=2, canaries={"measured": 64})
    result = run_federation(setup, out=tmp_path, keep_private=True)
    records = measured_records(setup, build_global_model(setup))
    with sqlite3.connect(tmp_path / "private.sqlite") as db:
        rows = db.execute("SELECT round, partition, examples FROM batches").fetchall()
    for server_round, partition, examples in rows:
        texts = {e["text"] for e in json.loads(examples)}
        inserted = {e.text for e in records.planted(server_round - 1, partition)}
        held_out = {records.example(i).text for i in range(64) if not records.inserted[i]}
        assert inserted <= texts and not held_out & texts
    [privacy] = result.privacy  # no attack: scored by their gradients alone
    assert privacy.kind == "records" and privacy.scoring == "gradient" and privacy.canaries == 64
    assert privacy.overall.auroc == 1.0
    assert privacy.overall.gdp_epsilon == pytest.approx(privacy.overall.ceiling)
    assert [r.privacy["records, gradient"].canaries for r in result.rounds] == [32, 32]
    with sqlite3.connect(tmp_path / "federation.sqlite") as db:
        kept = dict(db.execute("SELECT key, value FROM meta WHERE key LIKE 'privacy:%'"))
    assert json.loads(kept["privacy:2"])["records, gradient"]["auroc"] == 1.0
    from gradleak.reports.federation import read_federation
    from gradleak.reports.render import render_federation

    page = render_federation(read_federation(tmp_path))
    assert "<h2>Measured epsilon</h2>" in page and page.count("<svg") == 1
    assert "Measured epsilon per round (canaries)" in page


@dataclass
class StandInReply:
    """What the canary clients read of a client's reply (a Message needs a live run)."""

    content: RecordDict

    def has_error(self) -> bool:
        return False


def test_canary_clients_join_each_rounds_aggregate_and_are_scored_against_it(tmp_path):
    """FedAvg, 2 rounds of 2 tiny-bert clients and 32 canary clients: the aggregate the model
    goes on with holds the round's inserted canaries exactly as declared (the clients' mean
    and each canary's norm times its direction, weighed as one client each), and undefended
    every inserted canary stands out."""
    from gradleak.federated.canaries import CanaryClients
    from gradleak.integrations.flower.arrays import load_arrays, record_of, trainable_tensors
    from gradleak.integrations.flower.canary_clients import FlowerCanaryClients

    setup = tiny_setup(rounds=2, canaries={"canary_clients": 32})
    result = run_federation(setup, out=tmp_path)
    [privacy] = result.privacy
    assert privacy.kind == "clients" and privacy.canaries == 32 and privacy.overall.auroc == 1.0
    assert [r.privacy["canary clients"].canaries for r in result.rounds] == [16, 16]
    # the mixing, on arrays of our own: two client deltas and the round's inserted canaries
    gm = build_global_model(setup)
    sent = model_arrays(gm)
    before = load_arrays(gm, sent)
    canaries = CanaryClients(8, 1, seed=5)
    mixer = FlowerCanaryClients(canaries, fedsgd=False, server_lr=1.0)
    mixer.audit.norm = 2.0
    deltas = [{n: torch.full_like(t, float(k + 1)) for n, t in before.items()} for k in range(2)]
    replies = [StandInReply(RecordDict({"arrays": record_of({n: before[n] + d[n] for n in d})}))
               for d in deltas]  # fmt: skip
    aggregated = record_of({n: before[n] + 1.5 for n in before})  # the clients' mean delta
    after = trainable_tensors(gm, aggregated)
    mixed = mixer.mixed(0, gm, before, after, replies, "arrays")
    inserted = canaries.inserted_in(0)
    total = {n: torch.full_like(t, 3.0) for n, t in before.items()}
    for index in inserted:
        for n, t in canaries.direction(index, before).items():
            total[n] += 2.0 * t
    for n in before:
        torch.testing.assert_close(mixed[n], before[n] + total[n] / (2 + len(inserted)))
