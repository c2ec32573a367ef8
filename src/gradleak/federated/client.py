"""The client side of a round: from a private batch to the update the server receives."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gradleak.federated.protocol import Protocol
from gradleak.federated.sharing import TensorSpec, apply_training_setup, shared_tensor_specs
from gradleak.models.registry import Victim
from gradleak.models.tasks import EncodedBatch, task_loss, unwrap


@dataclass
class GlobalModel:
    """The model as the server distributes it for one round, and what clients send back.

    ``model`` is trainable as the protocol says (LoRA-wrapped, embeddings frozen, dropout set);
    ``specs`` lists the update's tensors. Attackers work on their own copy; a FedSGD client
    differentiates this model in place (weights unchanged, modes restored), a FedAvg client
    trains a copy.
    """

    victim: Victim
    model: nn.Module
    protocol: Protocol
    specs: list[TensorSpec]

    @classmethod
    def build(cls, victim: Victim, protocol: Protocol, seed: int = 0) -> GlobalModel:
        torch.manual_seed(seed)  # LoRA's A matrices are drawn here
        model = apply_training_setup(victim.model, victim.adapter, protocol)
        specs = shared_tensor_specs(model, victim.adapter, protocol.share)
        return cls(victim=victim, model=model, protocol=protocol, specs=specs)

    @property
    def adapter(self):
        return self.victim.adapter

    @property
    def task(self) -> str:
        return self.victim.task

    def copy_model(self) -> nn.Module:
        return copy.deepcopy(self.model)

    def named_parameter(self, model: nn.Module, name: str) -> nn.Parameter:
        return dict(model.named_parameters())[name]

    def batch_loss(self, model: nn.Module, batch: EncodedBatch) -> torch.Tensor:
        return task_loss(
            model,
            self.adapter,
            self.task,
            batch.attention_mask,
            batch.labels,
            input_ids=batch.input_ids,
            token_type_ids=batch.token_type_ids,
        )


@dataclass
class ClientUpdate:
    """What the server receives: named tensors plus the round's protocol metadata.

    ``kind`` is ``gradient`` (FedSGD) or ``weight_delta`` (FedAvg: new minus old weights).
    """

    kind: str
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, Any] = field(default_factory=dict)


def set_mode(model: nn.Module, mode: str) -> None:
    model.train(mode == "train")


@contextlib.contextmanager
def client_mode(model: nn.Module, mode: str) -> Iterator[nn.Module]:
    """``model`` in the client's ``mode`` for the block; every module's own flag restored after.

    FedSGD runs on the global model itself: a gradient changes no weight, so the only state
    it touches is the train/eval flags (a copy of a 135M-parameter model costs more than that).
    """
    flags = [(module, module.training) for module in model.modules()]
    set_mode(model, mode)
    try:
        yield model
    finally:
        for module, training in flags:
            module.training = training


def compute_update(global_model: GlobalModel, batch: EncodedBatch, seed: int) -> ClientUpdate:
    """Run the client's round on its private batch. Dropout masks are drawn from ``seed``.

    The global model is left as it was: FedSGD differentiates it in place (weights untouched,
    modes restored), FedAvg trains a copy.
    """
    protocol = global_model.protocol
    torch.manual_seed(seed)
    if protocol.algorithm == "fedsgd":
        with client_mode(global_model.model, protocol.mode) as model:
            tensors = _gradient(global_model, model, batch)
        kind = "gradient"
    else:
        model = global_model.copy_model()
        set_mode(model, protocol.mode)
        params = dict(model.named_parameters())
        before = {s.param: params[s.param].detach().clone() for s in global_model.specs}
        _local_training(global_model, model, batch, torch.Generator().manual_seed(seed))
        tensors = {
            s.key: s.take(params[s.param].detach() - before[s.param]).clone()
            for s in global_model.specs
        }
        kind = "weight_delta"
    n = batch.input_ids.shape[0]
    metadata = {
        "algorithm": protocol.algorithm,
        "mode": protocol.mode,
        "dropout": global_model.adapter.dropout_rate(unwrap(global_model.model)),
        "n_samples": n,
        "local_steps": protocol.local_steps(n),
        **protocol.model_dump(mode="json"),
    }
    return ClientUpdate(kind=kind, tensors=tensors, metadata=metadata)


def timed_update(
    global_model: GlobalModel, batch: EncodedBatch, seed: int
) -> tuple[ClientUpdate, float]:
    """:func:`compute_update` and its wall seconds: the client's cost, for the run's record.

    The seconds stay with the caller: they are not part of what the server receives.
    """
    start = time.perf_counter()
    update = compute_update(global_model, batch, seed)
    return update, time.perf_counter() - start


def _gradient(
    global_model: GlobalModel, model: nn.Module, batch: EncodedBatch
) -> dict[str, torch.Tensor]:
    """FedSGD: the batch loss's gradient, one tensor per spec (zeros where a parameter is
    unused). Only the shared parameters are differentiated."""
    params = dict(model.named_parameters())
    names = sorted({spec.param for spec in global_model.specs})
    loss = global_model.batch_loss(model, batch)
    grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    by_name = {
        n: torch.zeros_like(params[n]) if g is None else g.detach()
        for n, g in zip(names, grads, strict=True)
    }
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for spec in global_model.specs:
        tensor = spec.take(by_name[spec.param])
        # A gradient is a fresh tensor that only this update holds. Copied are a slice (it
        # would keep the whole fused gradient alive) and a tensor already in the update (a
        # LoRA A matrix sent once per role of a fused layer), so each tensor owns its memory.
        storage = tensor.untyped_storage().data_ptr()
        if spec.dim is not None or storage in seen:
            tensor = tensor.clone()
        seen.add(storage)
        tensors[spec.key] = tensor
    return tensors


def _local_training(
    global_model: GlobalModel, model: nn.Module, batch: EncodedBatch, generator: torch.Generator
) -> None:
    """FedAvg local training: E epochs over the n_k samples in local batches of b."""
    protocol = global_model.protocol
    trainable = [p for p in model.parameters() if p.requires_grad]
    if protocol.optimizer == "sgd":
        optimizer = torch.optim.SGD(trainable, lr=protocol.lr)
    else:
        optimizer = torch.optim.Adam(trainable, lr=protocol.lr)
    n = batch.input_ids.shape[0]
    b = protocol.local_batch_size or n
    for _ in range(protocol.epochs):
        order = torch.randperm(n, generator=generator) if protocol.shuffle else torch.arange(n)
        for start in range(0, n, b):
            optimizer.zero_grad(set_to_none=True)
            loss = global_model.batch_loss(model, batch.select(order[start : start + b]))
            loss.backward()
            optimizer.step()
