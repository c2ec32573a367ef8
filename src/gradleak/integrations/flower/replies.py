"""A Flower reply checked before the audit attacks it: who sent it, its arrays against the
global model's tensors (:mod:`~gradleak.integrations.flower.arrays`), its declared number of
examples and batch facts, each in range; whatever does not fit is a one-line
:class:`~gradleak.errors.GradleakError` that the audit records as the reply's refusal. The
server's model and facts (:class:`ServerModel`) live here too: the checks read them."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Literal

import torch
from flwr.app import Message

from gradleak.api.update import Update
from gradleak.errors import GradleakError, last_line
from gradleak.federated.client import GlobalModel
from gradleak.federated.protocol import Protocol
from gradleak.integrations.flower.arrays import quoted, reply_tensors, require_whole_model
from gradleak.models.loading import load_victim

# The reply's record with the batch facts a client declares (lengths, labels): LAMP and TAG's
# threat model grants them; a real client sends none unless told to.
FACTS_KEY = "batch-facts"

# The most examples one reply may declare (num-examples, and so its lengths and labels): a
# round of more is no batch the attacks here invert, and facts for each of them would have the
# server build a batch of that size.
MAX_EXAMPLES = 65_536

# The longest refusal reason an entry keeps (a client's error may be a whole traceback).
MAX_REASON = 300


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


def node_of(reply: Message) -> int | None:
    """The node id of ``reply``'s sender (Flower's: a 64-bit unsigned number), or None where
    it is no such number."""
    node = reply.metadata.src_node_id
    if isinstance(node, numbers.Integral) and not isinstance(node, bool) and 0 <= node < 2**64:
        return int(node)
    return None


def node_order(reply: Message) -> tuple[int, int, str]:
    """Replies by node id; any whose id is no number last, in a fixed order of their own."""
    node = node_of(reply)
    return (0, node, "") if node is not None else (1, 0, repr(reply.metadata.src_node_id))


def reason_line(text: str) -> str:
    """A reason on one line, cut to :data:`MAX_REASON` characters."""
    line = " ".join(str(text).split()) or "no reason given"
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 3] + "..."


@dataclass
class Received:
    """A reply the audit can attack, each part checked: who sent it, its update, and the batch
    facts the server takes from it (False: not known)."""

    node: int
    update: Update
    lengths: list[int] | Literal[False]
    labels: list[int] | Literal[False]


def received(
    reply: Message, server: ServerModel, arrays_key: str, before: dict[str, Any]
) -> Received:
    """``reply`` checked, part by part, for an attack on it by the server of ``server``
    (``arrays_key``: its ArrayRecord; ``before``: the weights the server sent); a
    GradleakError says in one line what does not fit."""
    if reply.has_error():
        reason = last_line(str(reply.error.reason or ""))
        raise GradleakError(f"the client replied with an error: {reason}")
    node = node_of(reply)
    if node is None:
        raise GradleakError(
            f"the reply's node id {quoted(reply.metadata.src_node_id)} is no node id"
        )
    update = update_of(reply, server, arrays_key, before)
    lengths, labels = declared_facts(reply, server, update.n_samples)
    return Received(node, update, lengths, labels)


def update_of(
    reply: Message, server: ServerModel, arrays_key: str, before: dict[str, Any]
) -> Update:
    """The reply as gradleak's update: a FedSGD gradient (the reply's arrays) or a FedAvg
    weight delta (the reply's weights minus the sent ones), with the protocol facts the
    server set and the client's declared number of examples; each checked
    (:func:`~gradleak.integrations.flower.arrays.reply_tensors`, :func:`declared_examples`).
    """
    global_model = server.global_model
    protocol = global_model.protocol
    record = reply.content.array_records.get(arrays_key)
    if record is None:
        raise GradleakError(f"the reply has no ArrayRecord '{arrays_key}'")
    arrays = reply_tensors(global_model, record, "the reply's arrays")
    n_samples = declared_examples(reply)
    if protocol.algorithm == "fedsgd":
        tensors, kind = arrays, "gradient"
    else:
        tensors = {name: arrays[name] - before[name].to(arrays[name].dtype) for name in arrays}
        kind = "weight_delta"
        unbounded = next((n for n, t in tensors.items() if not torch.isfinite(t).all()), None)
        if unbounded is not None:
            raise GradleakError(
                f"the reply's '{unbounded}' minus the sent weights is not finite: no update "
                "to attack"
            )
    return Update(
        kind=kind,  # type: ignore[arg-type]
        tensors=tensors,
        task=global_model.task,
        protocol=protocol,
        n_samples=n_samples,
    )


def declared_facts(
    reply: Message, server: ServerModel, n_samples: int | None = None
) -> tuple[list[int] | Literal[False], list[int] | Literal[False]]:
    """The lengths and labels the server is given (False: not known), from the reply's
    declared batch facts when the knowledge says the server has them; each checked: a
    list of whole numbers, one per example (``n_samples``, when declared), a length within
    the model's positions, a label one of its classes."""
    facts = reply.content.config_records.get(FACTS_KEY)
    model = server.global_model
    positions = model.adapter.max_positions(model.victim.model)
    classes = getattr(getattr(model.victim.model, "config", None), "num_labels", None)
    limits = {"lengths": ("length", 1, positions), "labels": ("label", 0, classes)}
    chosen: list[list[int] | Literal[False]] = []
    for wanted, key in ((server.known_lengths, "lengths"),
                        (server.known_labels, "labels")):  # fmt: skip
        if not wanted:
            chosen.append(False)
            continue
        if facts is None or key not in facts:
            raise GradleakError(
                f"the server is to know the {key}, and this client declared none: have "
                f"the clients send them in a '{FACTS_KEY}' ConfigRecord, or set "
                f"known_{key} False"
            )
        chosen.append(_whole_numbers(facts[key], key, n_samples, *limits[key]))
    lengths, labels = chosen
    if lengths and labels and len(lengths) != len(labels):
        raise GradleakError(f"the reply declares {len(lengths)} lengths and {len(labels)} labels")
    return lengths, labels


def declared_examples(reply: Message) -> int | None:
    """The ``num-examples`` of ``reply``'s MetricRecord (Flower's weighting key), checked: a
    whole number from 1 to :data:`MAX_EXAMPLES`; None where the reply declares none."""
    metrics = next(iter(reply.content.metric_records.values()), None)
    if metrics is None or "num-examples" not in metrics:
        return None
    value = metrics["num-examples"]
    whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not whole and isinstance(value, numbers.Real) and not isinstance(value, bool):
        whole = float(value).is_integer()  # 2.0; not NaN, Inf or 2.5
    if not whole:
        raise GradleakError(
            f"the reply's num-examples is {quoted(value)}, not a whole number of examples"
        )
    if not 1 <= value <= MAX_EXAMPLES:
        raise GradleakError(f"the reply's num-examples is {int(value)}, outside 1..{MAX_EXAMPLES}")
    return int(value)


def _whole_numbers(
    values: Any, key: str, n_samples: int | None, what: str, low: int, high: int | None
) -> list[int]:
    """A declared fact (``key``: lengths, labels) checked: a list of whole numbers, one per
    example, each ``what`` from ``low`` to below ``high`` (None: no upper limit)."""
    if not isinstance(values, list) or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values
    ):
        raise GradleakError(f"the reply's declared {key} are not whole numbers: {quoted(values)}")
    if n_samples is not None and len(values) != n_samples:
        raise GradleakError(f"the reply declares {len(values)} {key} for {n_samples} examples")
    if not 1 <= len(values) <= MAX_EXAMPLES:
        raise GradleakError(f"the reply declares {len(values)} {key}, not 1..{MAX_EXAMPLES}")
    bad = next((v for v in values if v < low or (high is not None and v >= high)), None)
    if bad is not None:
        top = "" if high is None else f" to {high - 1}"
        raise GradleakError(f"the reply declares a {what} {int(bad)}, not {low}{top}")
    return [int(v) for v in values]


def entry_node(reply: Message) -> int:
    node = node_of(reply)
    return -1 if node is None else node
