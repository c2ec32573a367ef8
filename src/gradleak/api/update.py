"""A client update as the public API hands it around: computed by ``gradleak.client_update``,
or captured elsewhere (a training loop's gradients, a FedAvg client's or a Flower round's two
state dicts) and checked against the model before any attack sees it.

An :class:`Update` holds what the server receives (the tensors) and the protocol facts it
knows (FedSGD or FedAvg and their settings, the number of samples, the public defenses). An
update computed here also carries :class:`BatchFacts`, what the server may be told of the batch
(lengths, labels), never its tokens; ``invert`` decides which of them the attacker knows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from gradleak.config import Scenario
from gradleak.config.options import config_from_options
from gradleak.data import Example
from gradleak.defenses import DefenseSettings
from gradleak.errors import GradleakError, OptionError, UpdateMismatchError
from gradleak.federated.client import GlobalModel, update_metadata
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import ServerKnowledge, server_knowledge
from gradleak.models.loading import task_of
from gradleak.models.tasks import EncodedBatch, unwrap

# A batch fact the attacker is given: None (what the update carries, if anything), True (what
# it carries: an error if nothing), False (unknown), or the values themselves.
Known = bool | Sequence[int] | None


@dataclass(frozen=True)
class BatchFacts:
    """What the server may know of a client's batch besides the update (``ServerKnowledge``'s
    batch part): its size, each sequence's length with the tokenizer's own tokens at their
    positions (``template_ids``, -1 at the private text), and the labels."""

    batch_size: int
    lengths: tuple[int, ...]
    template_ids: torch.Tensor
    token_type_ids: torch.Tensor | None
    labels: dict[str, torch.Tensor]

    @classmethod
    def of(cls, knowledge: ServerKnowledge) -> BatchFacts:
        assert knowledge.lengths is not None and knowledge.template_ids is not None
        assert knowledge.labels is not None
        return cls(
            knowledge.batch_size,
            knowledge.lengths,
            knowledge.template_ids,
            knowledge.token_type_ids,
            knowledge.labels,
        )


@dataclass
class Update:
    """One client's update and the protocol facts the server knows of it.

    ``kind`` is ``gradient`` (FedSGD) or ``weight_delta`` (FedAvg: new minus old weights);
    ``tensors`` are named as the model's parameters (peft's names under LoRA); ``protocol``
    and ``n_samples`` are the round's facts; ``facts``: what the server may be told of the
    batch (None for an update captured elsewhere); ``defenses``: the client's public ones.
    ``model_seed`` drew the global model's LoRA initialization, which the server distributed
    and so knows. ``info``: what a per-sample defense guarantees (DP-SGD's epsilon).
    """

    kind: Literal["gradient", "weight_delta"]
    tensors: dict[str, torch.Tensor]
    task: str
    protocol: Protocol = field(default_factory=Protocol)
    n_samples: int | None = None
    facts: BatchFacts | None = None
    defenses: tuple[DefenseSettings, ...] = ()  # the client's defenses declared public
    model_seed: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.n_samples is not None and self.n_samples < 1:
            raise OptionError(f"n_samples must be at least 1, got {self.n_samples}")

    @classmethod
    def from_gradients(
        cls,
        model: nn.Module,
        gradients: Mapping[str, torch.Tensor | None],
        *,
        n_samples: int | None = None,
        mode: Literal["train", "eval"] | None = None,
        task: str | None = None,
    ) -> Update:
        """A FedSGD update from a training loop's gradients.

        Args:
            model: The model the gradients were computed on (the global model).
            gradients: Each trainable parameter's name (``model.named_parameters()``) to its
                gradient, as ``{n: p.grad for n, p in model.named_parameters()}`` gives them
                (None: a parameter the loss did not reach, sent as zeros).
            n_samples: The batch size, if the client declares it. Without it (and without
                lengths or labels given to ``invert``) the server reads it from the update
                where that is exact: see :meth:`counted_batch_size`.
            mode: The mode the gradient was computed in (default: the model's current one).
            task: The task (default: the model head's).

        Returns:
            The update, a ``gradient``, its tensors copied.

        Raises:
            UpdateMismatchError: A trainable parameter without a gradient entry, a name the
                model's trainable parameters do not have, or a gradient of another shape.
            OptionError: ``n_samples`` below 1, or an invalid ``mode``.
        """
        trainable = _trainable_shapes(model)
        device = next(model.parameters()).device
        given = {name: tensor for name, tensor in gradients.items() if tensor is not None}
        _check_names(given, trainable, "the gradients")
        tensors = {
            name: given[name].detach().clone()
            if name in given
            else torch.zeros(shape, device=device)
            for name, shape in trainable.items()
        }
        mode = mode or ("train" if model.training else "eval")
        return cls(
            kind="gradient",
            tensors=tensors,
            task=task or task_of(model),
            protocol=protocol_of({"mode": mode}),
            n_samples=n_samples,
        )

    @classmethod
    def from_weights(
        cls,
        model: nn.Module,
        before: Mapping[str, torch.Tensor],
        after: Mapping[str, torch.Tensor],
        *,
        epochs: int,
        local_batch_size: int | None,
        lr: float,
        optimizer: Literal["sgd", "adam"],
        n_samples: int,
        shuffle: bool = True,
        mode: Literal["train", "eval"] | None = None,
        task: str | None = None,
    ) -> Update:
        """A FedAvg update from the weights before and after a client's local training (two
        state dicts, as a FedAvg client or a Flower round produces them): their difference
        over the model's trainable parameters.

        ``epochs``, ``local_batch_size``, ``lr``, ``optimizer`` and ``shuffle`` are the
        round's local training, which the server set.

        Args:
            model: The global model (its trainable parameters decide what is compared).
            before: The weights the client started from (a state dict).
            after: The weights after its local training.
            epochs: Local epochs.
            local_batch_size: Local batch size (None: all ``n_samples`` in one step).
            lr: The local learning rate.
            optimizer: ``sgd`` or ``adam``.
            n_samples: The client's number of examples.
            shuffle: Whether the local batches were shuffled.
            mode: As in :meth:`from_gradients`.
            task: As in :meth:`from_gradients`.

        Returns:
            The update, a ``weight_delta`` (``after`` minus ``before``).

        Raises:
            UpdateMismatchError: A trainable parameter missing from either state dict, a
                tensor of another shape, or a name the model does not have.
            OptionError: An invalid value of the round's local training.
        """
        old = trainable_part(model, before, "the weights before")
        new = trainable_part(model, after, "the weights after")
        tensors = {name: (new[name] - old[name]).detach().clone() for name in old}
        round_facts = {"epochs": epochs, "local_batch_size": local_batch_size, "lr": lr,
                       "optimizer": optimizer, "shuffle": shuffle}  # fmt: skip
        mode = mode or ("train" if model.training else "eval")
        return cls(
            kind="weight_delta",
            tensors=tensors,
            task=task or task_of(model),
            protocol=protocol_of({"protocol": "fedavg", "mode": mode, **round_facts}),
            n_samples=n_samples,
        )

    def as_received(self, global_model: GlobalModel) -> UpdatePayload:
        """The update as an attack receives it from the server of ``global_model`` (checked
        against that model: a missing, extra or misshapen tensor is an error that names it),
        on the model's device."""
        params = dict(global_model.model.named_parameters())
        expected = {s.key: tuple(s.take(params[s.param]).shape) for s in global_model.specs}
        _check_names(self.tensors, expected, "the update")
        metadata = update_metadata(global_model, self.n_samples)
        device = global_model.device
        tensors = {key: tensor.to(device) for key, tensor in self.tensors.items()}
        return UpdatePayload(kind=self.kind, tensors=tensors, metadata=metadata)

    def counted_batch_size(self, global_model: GlobalModel) -> int | None:
        """The number of samples in this update, read from its tensors where that is exact;
        None where they cannot tell.

        A classifier's loss reads one position of each sequence (BERT's and MPNet's first,
        a decoder's last real token), and the last block's feed-forward output projection
        works on each position alone. Its weight's FedSGD gradient is therefore a sum of one
        outer product per sample, ``sum_b delta_b f_b^T``, exactly zero elsewhere: its rank
        is the batch size. The rank is read against the rounding of the tensor's precision
        (the singular values above a hundred times the smallest, which is rounding alone).
        Two identical samples count once (they are one sentence to recover anyway), and a
        sample the model already fits almost perfectly adds almost nothing and may go
        uncounted.

        It cannot tell (None) for a causal LM or question answering (every position is
        read: the rank counts tokens, not sequences), a FedAvg weight delta (several
        steps), an update with public defenses (noise fills the rank, pruning empties it),
        when that weight is not sent (LoRA, ``share``), or when the batch is more than half
        the matrix's smaller side (near it the rank no longer tells samples from rounding).
        """
        if self.kind != "gradient" or self.defenses or global_model.task != "classification":
            return None
        model = global_model.model
        hf = unwrap(model)
        last = global_model.adapter.num_layers(hf) - 1
        weight = getattr(global_model.adapter.role_module(hf, last, "p").module, "weight", None)
        name = next((n for n, p in model.named_parameters() if p is weight), None)
        spec = next((s for s in global_model.specs if s.param == name and s.dim is None), None)
        tensor = self.tensors.get(spec.key) if spec is not None else None
        if tensor is None or tensor.dim() != 2 or not tensor.is_floating_point():
            return None
        return _samples_in_rank(tensor)

    def knowledge(
        self, global_model: GlobalModel, known_labels: Known = None, known_lengths: Known = None
    ) -> ServerKnowledge:
        """What the server knows when it attacks this update (see ``Known``): the global
        model, the public defenses, and the batch facts it is given."""
        facts = self.facts
        lengths = _chosen(known_lengths, facts.lengths if facts else None, "lengths")
        labels = _chosen(known_labels, facts.labels if facts else None, "labels")
        if labels is not None and not isinstance(labels, dict):
            labels = _label_tensors(labels, global_model.task)
        template = token_types = None
        if lengths is not None and facts is not None and tuple(lengths) == facts.lengths:
            template, token_types = facts.template_ids, facts.token_type_ids
        elif lengths is not None:
            known = server_knowledge(global_model, _batch_of_lengths(global_model, lengths))
            template, token_types = known.template_ids, known.token_type_ids
        device = global_model.device  # the facts go where the attack computes

        def placed(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device)

        return ServerKnowledge(
            global_model=global_model,
            batch_size=self._batch_size(global_model, lengths, labels),
            lengths=None if lengths is None else tuple(lengths),
            template_ids=placed(template),
            token_type_ids=placed(token_types),
            labels=None if labels is None else {k: placed(v) for k, v in labels.items()},
            defenses=self.defenses,
        )

    def _batch_size(
        self, global_model: GlobalModel, lengths: Sequence[int] | None, labels: dict | None
    ) -> int:
        """The batch size every source agrees on (the facts, the lengths, the labels, the
        declared n_samples), else the one the update's tensors tell
        (:meth:`counted_batch_size`); an error if they differ or none says it."""
        sizes = {len(lengths)} if lengths is not None else set()
        sizes |= {len(v) for v in (labels or {}).values()}
        sizes |= {n for n in (self.n_samples, self.facts and self.facts.batch_size) if n}
        if len(sizes) > 1:
            raise GradleakError(
                f"the batch sizes of the update, its lengths and its labels differ "
                f"({', '.join(map(str, sorted(sizes)))}): give facts of the same batch"
            )
        if not sizes:
            counted = self.counted_batch_size(global_model)
            if counted is None:
                raise GradleakError(
                    "the update does not say how many samples it holds, and its tensors cannot "
                    "tell (only a classifier's FedSGD gradient does): pass n_samples to "
                    "Update.from_gradients, or known_lengths to invert"
                )
            return counted
        return sizes.pop()


def _samples_in_rank(gradient: torch.Tensor) -> int | None:
    """The rank of a sum of per-sample outer products, against its own precision's rounding
    (see :meth:`Update.counted_batch_size`); None where it cannot be told."""
    values = torch.linalg.svdvals(gradient.detach().cpu().double())
    eps = torch.finfo(gradient.dtype).eps
    largest, floor = float(values[0]), float(values[-1])
    if largest == 0 or floor > 4 * eps * largest:  # the smallest is no rounding: full rank
        return None
    rank = int((values > max(100 * floor, eps * largest)).sum())
    return rank if 0 < rank <= min(gradient.shape) // 2 else None


def protocol_of(options: Mapping[str, Any]) -> Protocol:
    """The protocol that the scenario ``options`` (the CLI's names) describe, validated as
    the CLI validates them."""
    return scenario_of(options).protocol


def scenario_of(options: Mapping[str, Any]) -> Scenario:
    """The scenario that flat scenario ``options`` describe (one-line errors naming them)."""
    return config_from_options(options).scenario


def trainable_part(
    model: nn.Module, weights: Mapping[str, torch.Tensor], what: str
) -> dict[str, torch.Tensor]:
    """The entries of ``weights`` (a state dict, or any named tensors) for ``model``'s trainable
    parameters, each checked present with its shape; other tensors of the model (buffers,
    frozen or tied weights) may come along and are left out, a name the model does not have
    is an error naming it."""
    trainable = _trainable_shapes(model)
    own = {k: v for k, v in weights.items() if k in trainable}
    _check_names(own, trainable, what)
    known = {*trainable, *model.state_dict()}
    extra = next((name for name in weights if name not in known), None)
    if extra is not None:
        raise UpdateMismatchError(
            f"'{extra}' in {what} is no tensor of the model: pass the state dicts of this model"
        )
    return own


def _trainable_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}


def _check_names(
    tensors: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]], what: str
) -> None:
    """Every expected tensor present with its shape, and nothing else; the first that does not
    fit, in the model's order, is named."""
    for name, shape in expected.items():
        if name not in tensors:
            raise UpdateMismatchError(
                f"no tensor in {what} for the model's trainable parameter '{name}': send every "
                "trainable parameter's (a frozen one: set its requires_grad to False)"
            )
        if tuple(tensors[name].shape) != shape:
            raise UpdateMismatchError(
                f"'{name}' in {what} has shape {list(tensors[name].shape)} but the model's is "
                f"{list(shape)}: is this an update of another model?"
            )
    extra = next((name for name in tensors if name not in expected), None)
    if extra is not None:
        raise UpdateMismatchError(
            f"'{extra}' in {what} is no trainable parameter of the model: send only the "
            "model's trainable parameters, named as named_parameters() names them"
        )


def _chosen(value: Known, own: Any, what: str) -> Any:
    """The fact the attacker is given: the update's own, none, or the caller's values."""
    if value is False:
        return None
    if value is None or value is True:
        if value is True and own is None:
            raise GradleakError(
                f"the update carries no {what}: pass known_{what}=[...] with one per sample"
            )
        return own
    return list(value)


def _label_tensors(labels: list[int], task: str) -> dict[str, torch.Tensor]:
    if task != "classification":
        raise GradleakError(
            f"known_labels are class labels, and a {task} model has none: drop known_labels"
        )
    return {"label": torch.tensor([int(label) for label in labels], device="cpu")}


FILLER_WORD = "the"  # one token in every supported tokenizer


def _batch_of_lengths(global_model: GlobalModel, lengths: Sequence[int]) -> EncodedBatch:
    """A batch with the given lengths (tokenizer's own tokens included), filler text in the
    private positions: what the server can build from the lengths alone, tokenized the way
    the client's batch was (so the template of special tokens is the same)."""
    if global_model.task == "qa":
        raise GradleakError("known_lengths of question/context pairs cannot be given: use run")
    own = global_model.encode([Example(FILLER_WORD, label=0)]).lengths[0] - 1
    if min(lengths) <= own:
        raise GradleakError(
            f"a length of {min(lengths)} leaves no room for text: lengths count the tokenizer's "
            f"own {own} token(s) ([CLS]/[SEP], BOS/EOS) too"
        )
    examples = [Example(" ".join([FILLER_WORD] * (n - own)), label=0) for n in lengths]
    batch = global_model.encode(examples)
    if batch.lengths != list(lengths):
        raise GradleakError(f"this tokenizer cannot form sequences of lengths {list(lengths)}")
    return batch
