"""A curious (or broken) client's reply to a Flower round: the audit refuses what it cannot
read, says why in one line, attacks the honest clients' updates all the same, and the wrapped
strategy aggregates exactly the replies it would have aggregated without the audit.

The replies are Flower ``Message``s built here and handed to ``LeakageAudit.aggregate_train``:
one honest reply from gradleak's own client, one malformed copy of the other client's. The
audit passes every reply on unchanged, so where FedAvg itself cannot aggregate a malformed
reply (a string or zero total of ``num-examples``, arrays of other names, shapes or a complex
dtype) the audit's ``aggregate_train`` raises exactly what FedAvg raises without the audit,
after the audit's own entries for the round are made.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

flwr = None
if os.environ.get("GRADLEAK_REQUIRE_FLOWER") == "1":
    import flwr  # noqa: F811  (CI: the extra must be installed; its absence fails)
else:
    flwr = pytest.importorskip(
        "flwr", reason="the flower extra is not installed: pip install 'gradleak[flower]'"
    )

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from gradleak.integrations.flower import LeakageAudit, ServerModel, client_app  # noqa: E402
from gradleak.integrations.flower.arrays import model_arrays, trainable  # noqa: E402
from gradleak.integrations.flower.client import build_global_model  # noqa: E402
from gradleak.integrations.flower.partition import client_partitions  # noqa: E402
from gradleak.integrations.flower.replies import FACTS_KEY  # noqa: E402
from gradleak.integrations.flower.setup import setup_of  # noqa: E402
from tests.helpers import SpyAttack  # noqa: E402

HONEST, HOSTILE = 1000, 1001  # the nodes of partitions 0 and 1


def _server_identity(monkeypatch) -> None:
    """Flower stamps a message with the identity of the process's task, which its runtimes
    set; here the test plays the server's part, so it sets them."""
    from flwr.supercore.task_identity import TaskIdentity

    for attribute, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, attribute, value)


@pytest.fixture(autouse=True)
def _identity(monkeypatch):
    _server_identity(monkeypatch)


class Grid:
    """Two nodes, each gradleak's client on its own partition, called in this process."""

    def __init__(self, app) -> None:
        self.app = app
        self.nodes = {HONEST: 0, HOSTILE: 1}

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, timeout=None):
        return [self.reply(message) for message in messages]

    def reply(self, message):
        node = message.metadata.dst_node_id
        config = {"partition-id": self.nodes[node], "num-partitions": len(self.nodes)}
        context = Context(
            run_id=1, node_id=node, node_config=config, state=RecordDict(), run_config={}
        )
        return self.app(message, context)


class Round:
    """Round 1 of a two-client FedAvg federation of tiny-bert whose server is told the
    clients' lengths and labels: the global model, the arrays sent, the train messages and
    the two clients' honest replies."""

    def __init__(self) -> None:
        self.setup = setup_of(
            {
                "model": "tiny-bert",
                "rounds": 1,
                "batch_size": 2,
                "partition": {"clients": 2},
                "protocol": {"algorithm": "fedavg", "mode": "eval", "lr": 0.05},
                "audit": {"known_lengths": True, "known_labels": True},
                "utility": {"dev_examples": 0},
            }
        )
        self.global_model = build_global_model(self.setup)
        self.sent = model_arrays(self.global_model)
        self.grid = Grid(client_app(self.setup, client_partitions(self.setup)))
        self.messages = {
            m.metadata.dst_node_id: m
            for m in strategy().configure_train(1, self.sent, ConfigRecord(), self.grid)
        }
        self.honest = {node: self.grid.reply(m) for node, m in self.messages.items()}


@pytest.fixture(scope="module")
def round_one():
    with pytest.MonkeyPatch.context() as monkeypatch:
        _server_identity(monkeypatch)
        yield Round()


def strategy() -> FedAvg:
    return FedAvg(fraction_evaluate=0.0, min_available_nodes=2)


def parts(reply: Message) -> dict:
    """A reply's records, copied: each can be changed without changing the reply."""
    content = reply.content
    return {
        "arrays": dict(content["arrays"].items()),
        "metrics": dict(content["metrics"].items()),
        "facts": dict(content[FACTS_KEY].items()),
    }


def forced(record, key, value):
    """``record`` with ``key`` set to ``value`` past Flower's own type check (as a record
    read by another deserializer, or written around the check by a Python client, holds it)."""
    record.__dict__["_data"][key] = value
    return record


def rebuilt(round_one: Round, changes) -> Message:
    """The hostile client's honest reply, changed by ``changes(parts)``, as a new reply."""
    content = parts(round_one.honest[HOSTILE])
    raw = changes(content) or {}
    metrics = MetricRecord({k: v for k, v in content["metrics"].items() if k not in raw})
    facts = ConfigRecord({k: v for k, v in content["facts"].items() if k not in raw})
    for key, value in raw.items():
        forced(metrics if key == "num-examples" else facts, key, value)
    records = RecordDict(
        {"arrays": ArrayRecord(content["arrays"]), "metrics": metrics, FACTS_KEY: facts}
    )
    return Message(records, reply_to=round_one.messages[HOSTILE])


def first_name(round_one: Round) -> str:
    return next(iter(trainable(round_one.global_model)))


def with_array(name_of, array_of):
    """Changes that set the array ``name_of(round)`` to ``array_of(its ndarray)``."""

    def change(round_one):
        def apply(content):
            name = name_of(round_one)
            content["arrays"][name] = Array(array_of(content["arrays"][name].numpy()))

        return apply

    return change


def values(key, value):
    """Changes that set the reply's ``key`` (num-examples, lengths, labels) to ``value``."""
    return lambda round_one: lambda content: {key: value}


def without_first(round_one):
    def apply(content):
        del content["arrays"][first_name(round_one)]

    return apply


def with_extra(round_one):
    def apply(content):
        content["arrays"]["classifier.extra"] = Array(np.zeros(3, dtype=np.float32))

    return apply


def error_reply(round_one: Round) -> Message:
    reason = "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA out of memory"
    return Message(Error(code=3, reason=reason), reply_to=round_one.messages[HOSTILE])


# (kind, the changes to the hostile client's reply, what its refusal says)
HOSTILE_REPLIES = [
    ("num-examples a string", values("num-examples", "2"), "num-examples is '2'"),
    ("num-examples negative", values("num-examples", -2), "num-examples is -2"),
    ("num-examples huge", values("num-examples", 10**12), "num-examples is 1000000000000"),
    ("num-examples NaN", values("num-examples", math.nan), "num-examples is nan"),
    ("num-examples not whole", values("num-examples", 2.5), "num-examples is 2.5"),
    ("lengths of the wrong count", values("lengths", [7, 7, 7]), "3 lengths for 2 examples"),
    ("lengths negative", values("lengths", [-5, 7]), "length -5"),
    ("lengths huge", values("lengths", [10**9, 7]), "length 1000000000"),
    ("lengths not whole", values("lengths", [7.5, 7.0]), "lengths are not whole numbers"),
    ("lengths not a list", values("lengths", "7,7"), "lengths are not whole numbers"),
    ("labels of the wrong type", values("labels", ["pos", "neg"]), "labels are not whole"),
    ("labels booleans", values("labels", [True, False]), "labels are not whole"),
    ("labels out of range", values("labels", [7, 0]), "label 7"),
    ("a missing tensor", without_first, "no tensor in the reply's arrays"),
    ("an extra array", with_extra, "'classifier.extra' in the reply's arrays"),
    (
        "a wrong shape",
        with_array(first_name, lambda a: np.zeros((3, *a.shape), a.dtype)),
        "has shape",
    ),
    ("a wrong dtype", with_array(first_name, lambda a: a.astype(np.int64)), "int64"),
    ("complex values", with_array(first_name, lambda a: a.astype(np.complex64)), "complex64"),
    (
        "NaN values",
        with_array(
            first_name,
            lambda a: np.where(np.arange(a.size).reshape(a.shape) == 0, np.nan, a).astype(a.dtype),
        ),  # fmt: skip
        "not finite",
    ),
    ("Inf values", with_array(first_name, lambda a: np.full_like(a, np.inf)), "not finite"),
    (
        "values past the model's float range",
        with_array(first_name, lambda a: np.full(a.shape, 1e300)),
        "not finite",
    ),
]


def outcome(strategy, replies):
    """What aggregating ``replies`` gives: its arrays and metrics, or the error it raised."""
    try:
        arrays, metrics = strategy.aggregate_train(1, replies)
    except Exception as exc:  # the wrapped strategy's own verdict on the replies
        return ("raised", type(exc), str(exc))
    return ("aggregated", None if arrays is None else arrays.to_numpy_ndarrays(), metrics)


def assert_same(audited, plain):
    assert audited[0] == plain[0], (audited, plain)
    if plain[0] == "raised":
        assert audited[1:] == plain[1:]
        return
    assert audited[2] == plain[2]
    assert (audited[1] is None) == (plain[1] is None)
    for mine, theirs in zip(audited[1] or [], plain[1] or [], strict=True):
        np.testing.assert_array_equal(mine, theirs)  # NaN where FedAvg has NaN
        assert mine.dtype == theirs.dtype


def audit_of(round_one: Round) -> tuple[LeakageAudit, SpyAttack]:
    audit = LeakageAudit(
        strategy(),
        ["dager"],
        ServerModel(round_one.global_model, known_lengths=True, known_labels=True),
    )
    spy = SpyAttack()
    audit._attackers = [spy]
    list(audit.configure_train(1, round_one.sent, ConfigRecord(), round_one.grid))
    return audit, spy


def check_round(round_one: Round, hostile: Message, reason: str) -> LeakageAudit:
    """The audit's round with the honest reply and ``hostile``: the audit refuses the hostile
    reply saying ``reason`` in one line, attacks the honest update all the same, and the
    aggregate (or the error) is FedAvg's own on the same replies."""
    replies = [round_one.honest[HONEST], hostile]
    audit, spy = audit_of(round_one)
    assert_same(outcome(audit, replies), outcome(strategy(), replies))
    entries = {entry.node: entry for entry in audit.entries}
    assert set(entries) == {HONEST, HOSTILE}
    refused = entries[HOSTILE]
    assert refused.refusal is not None and reason in refused.refusal, refused.refusal
    assert "\n" not in refused.refusal and "Traceback" not in refused.refusal
    assert refused.texts == [] and refused.token_ids == []
    assert entries[HONEST].refusal is None
    assert len(spy.seen) == 1  # the honest update, and only it, reached the attack
    assert spy.seen[0][1].batch_size == 2
    return audit


@pytest.mark.parametrize(
    ("changes", "reason"),
    [pytest.param(changes, reason, id=kind) for kind, changes, reason in HOSTILE_REPLIES],
)
def test_a_malformed_reply_is_refused_and_the_round_goes_on(round_one, changes, reason):
    check_round(round_one, rebuilt(round_one, changes(round_one)), reason)


def test_an_error_reply_is_refused_with_its_last_line_and_noted_as_a_failure(round_one):
    audit = check_round(
        round_one, error_reply(round_one), "the client replied with an error: RuntimeError"
    )
    assert [(r, node) for r, node, _ in audit.failures] == [(1, HOSTILE)]


def test_a_reply_without_its_arrays_is_refused(round_one):
    content = parts(round_one.honest[HOSTILE])
    records = RecordDict(
        {"metrics": MetricRecord(content["metrics"]), FACTS_KEY: ConfigRecord(content["facts"])}
    )
    hostile = Message(records, reply_to=round_one.messages[HOSTILE])
    check_round(round_one, hostile, "no ArrayRecord 'arrays'")


def test_a_forged_node_id_is_refused(round_one):
    hostile = rebuilt(round_one, lambda content: None)
    hostile.metadata.__dict__["_src_node_id"] = "1001; DROP TABLE"
    replies = [round_one.honest[HONEST], hostile]
    audit, spy = audit_of(round_one)
    assert_same(outcome(audit, replies), outcome(strategy(), replies))
    refused = [e for e in audit.entries if e.refusal]
    assert [e.node for e in refused] == [-1] and "node id" in refused[0].refusal
    assert len(spy.seen) == 1


def test_honest_replies_are_attacked_and_aggregated_as_before(round_one):
    replies = list(round_one.honest.values())
    audit, spy = audit_of(round_one)
    assert_same(outcome(audit, replies), outcome(strategy(), replies))
    assert [e.refusal for e in audit.entries] == [None, None]
    assert len(spy.seen) == 2
