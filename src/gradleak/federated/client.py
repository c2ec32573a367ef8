"""The client side of a round: from a private batch to the update the server receives."""

from __future__ import annotations

import copy
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
    ``specs`` lists the update's tensors. Clients and attackers each work on their own copy.
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


def compute_update(global_model: GlobalModel, batch: EncodedBatch, seed: int) -> ClientUpdate:
    """Run the client's round on its private batch. Dropout masks are drawn from ``seed``."""
    protocol = global_model.protocol
    model = global_model.copy_model()
    set_mode(model, protocol.mode)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    params = dict(model.named_parameters())
    if protocol.algorithm == "fedsgd":
        loss = global_model.batch_loss(model, batch)
        names = sorted({spec.param for spec in global_model.specs})
        grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
        by_name = {
            n: torch.zeros_like(params[n]) if g is None else g
            for n, g in zip(names, grads, strict=True)
        }
        tensors = {s.key: s.take(by_name[s.param]).detach().clone() for s in global_model.specs}
        kind = "gradient"
    else:
        before = {s.param: params[s.param].detach().clone() for s in global_model.specs}
        _local_training(global_model, model, batch, generator)
        tensors = {
            s.key: s.take(params[s.param].detach() - before[s.param]).clone()
            for s in global_model.specs
        }
        kind = "weight_delta"
    n = batch.input_ids.shape[0]
    metadata = {
        "algorithm": protocol.algorithm,
        "mode": protocol.mode,
        "dropout": global_model.adapter.dropout_rate(unwrap(model)),
        "n_samples": n,
        "local_steps": protocol.local_steps(n),
        **protocol.model_dump(mode="json"),
    }
    return ClientUpdate(kind=kind, tensors=tensors, metadata=metadata)


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
