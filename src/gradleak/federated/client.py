"""The client side of a round: from a private batch to the update the server receives."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from gradleak.data import Example
from gradleak.errors import GradleakError
from gradleak.federated.arithmetic import client_arithmetic, storage_dtype
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.private import PrivateGradients, PrivateSteps, Staged
from gradleak.federated.protocol import Protocol
from gradleak.federated.sharing import TensorSpec, apply_training_setup, shared_tensor_specs
from gradleak.models.loading import Victim
from gradleak.models.tasks import EncodedBatch, encode_examples, task_loss, unwrap
from gradleak.runtime import devices


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

    @property
    def device(self) -> torch.device:
        """Where the model's weights are: the round and the attack compute there."""
        return next(self.model.parameters()).device

    def copy_model(self) -> nn.Module:
        return copy.deepcopy(self.model)

    def named_parameter(self, model: nn.Module, name: str) -> nn.Parameter:
        return dict(model.named_parameters())[name]

    def whole_key(self, weight: nn.Parameter) -> str | None:
        """The update's key for the whole of ``weight`` (a parameter of ``model``), or None
        where it is not sent whole (frozen, LoRA-adapted, not shared, or split in slices)."""
        params = dict(self.model.named_parameters())
        return next(
            (s.key for s in self.specs if s.dim is None and params.get(s.param) is weight), None
        )

    def token_embedding_key(self) -> str | None:
        """:meth:`whole_key` of the input token-embedding table."""
        return self.whole_key(self.adapter.token_embedding(unwrap(self.model)).weight)

    def encode(self, examples: list[Example], max_tokens: int | None = None) -> EncodedBatch:
        """Private examples tokenized as a client's fine-tuning does (the model's limit)."""
        victim = self.victim
        limit = victim.adapter.max_positions(victim.model)
        batch = encode_examples(victim.tokenizer, examples, self.task, limit, max_tokens)
        return batch.to(self.device)

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

    def example_losses(self, model: nn.Module, batch: EncodedBatch) -> torch.Tensor:
        """Each example's own training loss (shape ``[B]``), from one forward pass of the batch.

        What a per-sample defense clips is the gradient of these: example i's loss is what
        :meth:`batch_loss` gives for example i alone. The batch loss is a mean of
        cross-entropies (one per example, per target token, or per answer end); each is
        recorded unreduced and every example's terms are averaged. (A causal LM's batch loss
        weighs examples by their numbers of tokens; here each example weighs the same.)
        """
        with _CrossEntropies() as recorded:
            batch_loss = self.batch_loss(model, batch)
        return recorded.per_example(batch.input_ids.shape[0], batch_loss)


# A float16 AMP client's first loss scale (``torch.amp.GradScaler``'s default).
LOSS_SCALE = 2.0**16


class _CrossEntropies(TorchFunctionMode):
    """Records every ``F.cross_entropy`` computed under it unreduced; each still returns its
    mean, so the loss computed under it is unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.terms: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.cross_entropy:
            return func(*args, **kwargs)
        if kwargs.get("reduction", "mean") != "mean" or kwargs.get("weight") is not None:
            raise ValueError("per-example losses need unweighted mean cross-entropies")
        losses = func(*args, **{**kwargs, "reduction": "none"})
        target = args[1] if len(args) > 1 else kwargs["target"]
        counted = target != kwargs.get("ignore_index", -100)
        self.terms.append((losses, counted))
        return losses.sum() / counted.sum()

    def per_example(self, n: int, batch_loss: torch.Tensor) -> torch.Tensor:
        """Each of the ``n`` examples' mean over its own terms, averaged over the recorded
        cross-entropies; ``batch_loss`` must be the mean of those cross-entropies."""
        means, per_example = [], []
        for losses, counted in self.terms:
            means.append(losses.sum() / counted.sum())
            losses, counted = losses.reshape(n, -1), counted.reshape(n, -1)
            per_example.append(losses.sum(dim=1) / counted.sum(dim=1).clamp(min=1))
        if not self.terms or not torch.allclose(torch.stack(means).mean(), batch_loss):
            raise ValueError("the task's loss is not a mean of cross-entropies")
        return torch.stack(per_example).mean(dim=0)


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


def compute_update(
    global_model: GlobalModel,
    batch: EncodedBatch,
    seed: int,
    defenses: Sequence[Staged] = (),
    generator: torch.Generator | None = None,
) -> UpdatePayload:
    """Run the client's round on its private batch. Dropout masks are drawn from ``seed``.

    Of the scenario's ``defenses`` the client runs those that act per sample (DP-SGD) inside
    its steps, drawing their noise from ``generator``; the others act on the finished update
    and are not the client's round. The global model is left as it was: FedSGD differentiates
    it in place (weights untouched, modes restored), FedAvg trains a copy.
    """
    protocol = global_model.protocol
    private = _sample_defense(defenses)
    if private is not None and generator is None:
        raise ValueError("a per-sample defense draws its noise from a generator: pass one")
    torch.manual_seed(seed)
    if protocol.algorithm == "fedsgd":
        if private is None:
            tensors = fedsgd_gradient(global_model, batch)
        else:
            own = _client_model(global_model)
            with (
                client_mode(own, protocol.mode) as model,
                private.attach(model, generator) as steps,
            ):
                tensors = _private_gradient(global_model, model, batch, steps)
        kind = "gradient"
    else:
        model = _client_copy(global_model)
        set_mode(model, protocol.mode)
        params = dict(model.named_parameters())
        before = {s.param: params[s.param].detach().clone() for s in global_model.specs}
        shuffle = torch.Generator().manual_seed(seed)
        attached = contextlib.nullcontext() if private is None else private.attach(model, generator)
        with attached as steps:
            _local_training(global_model, model, batch, shuffle, steps)
        tensors = {
            s.key: s.take(_as_sent(params[s.param].detach()) - _as_sent(before[s.param])).clone()
            for s in global_model.specs
        }
        kind = "weight_delta"
    metadata = update_metadata(global_model, batch.input_ids.shape[0])
    return UpdatePayload(kind=kind, tensors=tensors, metadata=metadata)


def fedsgd_gradient(global_model: GlobalModel, batch: EncodedBatch) -> dict[str, torch.Tensor]:
    """The gradient a FedSGD client without a defense sends for ``batch``, in its mode and
    precision. Deterministic in eval mode; in train mode the dropout masks follow torch's
    global generator (``compute_update`` seeds it)."""
    protocol = global_model.protocol
    own = _client_model(global_model)
    with torch.enable_grad(), client_mode(own, protocol.mode) as model:
        return _gradient(global_model, model, batch)


def _client_model(global_model: GlobalModel) -> nn.Module:
    """What a FedSGD client differentiates: the global model itself in float32 (a gradient
    changes no weight), a float64 copy of it in float64."""
    if global_model.protocol.precision == "float32":
        return global_model.model
    return _client_copy(global_model)


def _client_copy(global_model: GlobalModel) -> nn.Module:
    """A copy of the global model in the client's precision (float64 holds every float32
    weight exactly: the same model, computing with 29 more bits; a bf16 client's weights are
    the global ones rounded to bf16)."""
    model = global_model.copy_model()
    dtype = storage_dtype(global_model.protocol)
    return model if dtype == torch.float32 else model.to(dtype)


def _as_sent(tensor: torch.Tensor) -> torch.Tensor:
    """An update tensor as the server receives it: a bf16 client's values in float32 (which
    holds each exactly, and the difference of two of them), a float64 client's as they are."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def update_metadata(global_model: GlobalModel, n_samples: int | None) -> dict[str, Any]:
    """The protocol facts an update of ``n_samples`` examples carries to the server (None:
    a count a FedSGD sender did not declare; a FedAvg update always declares its n_k)."""
    protocol = global_model.protocol
    if n_samples is None and protocol.algorithm == "fedavg":
        raise ValueError("a FedAvg update declares its number of samples")
    return {
        "algorithm": protocol.algorithm,
        "mode": protocol.mode,
        "dropout": global_model.adapter.dropout_rate(unwrap(global_model.model)),
        "n_samples": n_samples,
        "local_steps": 1 if n_samples is None else protocol.local_steps(n_samples),
        **protocol.model_dump(mode="json"),
    }


def _sample_defense(defenses: Sequence[Staged]) -> PrivateSteps | None:
    """The per-sample defense among ``defenses`` (at most one: ``build_defenses`` checks)."""
    private = [d for d in defenses if d.stage == "per_sample"]
    return private[0] if private else None


def timed_update(
    global_model: GlobalModel, batch: EncodedBatch, seed: int
) -> tuple[UpdatePayload, float]:
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
    grads = _client_gradients(global_model, model, batch, [params[n] for n in names])
    by_name = {
        n: torch.zeros_like(params[n]) if g is None else g.detach()
        for n, g in zip(names, grads, strict=True)
    }
    return _update_tensors(global_model.specs, by_name)


def _client_gradients(
    global_model: GlobalModel, model: nn.Module, batch: EncodedBatch, params: list[nn.Parameter]
) -> tuple[torch.Tensor | None, ...]:
    """The batch loss's gradient for ``params``, in the client's arithmetic.

    A float16 AMP client scales its loss before the backward pass so that small gradients do
    not underflow float16, and unscales after (``torch.amp.GradScaler``'s recipe: a power of
    two, halved while the scaled gradient overflows). bf16 has float32's range: no scale.
    """
    protocol = global_model.protocol
    if protocol.autocast != "float16":
        with client_arithmetic(protocol, global_model.device):
            loss = global_model.batch_loss(model, batch)
        return torch.autograd.grad(loss, params, allow_unused=True)
    scale = LOSS_SCALE
    while scale >= 1.0:
        with client_arithmetic(protocol, global_model.device):
            loss = global_model.batch_loss(model, batch)
        grads = torch.autograd.grad(loss * scale, params, allow_unused=True)
        if all(g is None or bool(torch.isfinite(g).all()) for g in grads):
            return tuple(None if g is None else g / scale for g in grads)
        scale /= 2
    raise GradleakError(
        "the float16 client's gradient is not finite at any loss scale (the loss itself "
        "overflows float16): use --autocast bfloat16"
    )


def _private_gradient(
    global_model: GlobalModel, model: nn.Module, batch: EncodedBatch, steps: PrivateGradients
) -> dict[str, torch.Tensor]:
    """FedSGD under a per-sample defense: one defended step's gradient (DP-SGD: each
    example's gradient clipped, their mean noised), as the defense leaves it in ``.grad``.
    Every trainable parameter is differentiated, shared or not: the clipping bounds each
    example's whole gradient. The parameters' ``.grad`` are restored after."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    saved = [p.grad for _, p in params]
    try:
        steps.gradient(
            lambda: _example_losses(global_model, model, batch), batch.input_ids.shape[0]
        )
        by_name = {n: p.grad.detach() for n, p in params}
    finally:
        for (_, p), grad in zip(params, saved, strict=True):
            p.grad = grad
    return _update_tensors(global_model.specs, by_name)


def _update_tensors(
    specs: list[TensorSpec], by_name: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The update's tensors: each spec's part of its parameter's gradient ``by_name``."""
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for spec in specs:
        tensor = spec.take(_as_sent(by_name[spec.param]))
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
    global_model: GlobalModel,
    model: nn.Module,
    batch: EncodedBatch,
    generator: torch.Generator,
    steps: PrivateGradients | None = None,
) -> None:
    """FedAvg local training: E epochs over the n_k samples in local batches of b; with a
    per-sample defense, every step's gradient is the defense's (DP-SGD's local steps)."""
    protocol = global_model.protocol
    trainable = [p for p in model.parameters() if p.requires_grad]
    if protocol.optimizer == "sgd":
        optimizer = torch.optim.SGD(trainable, lr=protocol.lr)
    else:
        optimizer = torch.optim.Adam(trainable, lr=protocol.lr)
    n = batch.input_ids.shape[0]
    b = protocol.local_batch_size or n
    # A float16 AMP client scales its loss (see ``_client_gradients``); disabled, the scaler
    # is a plain backward pass and step.
    scaled = protocol.autocast == "float16" and steps is None
    scaler = torch.amp.GradScaler(global_model.device.type, LOSS_SCALE, enabled=scaled)
    for _ in range(protocol.epochs):
        if protocol.shuffle:
            order = devices.randperm(n, generator=generator, device="cpu")
        else:
            order = torch.arange(n, device="cpu")
        for start in range(0, n, b):
            optimizer.zero_grad(set_to_none=True)
            local = batch.select(order[start : start + b])
            if steps is not None:
                rows = local.input_ids.shape[0]
                steps.gradient(
                    lambda local=local: _example_losses(global_model, model, local), rows
                )
                optimizer.step()
                continue
            with client_arithmetic(protocol, global_model.device):
                loss = global_model.batch_loss(model, local)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()


def _example_losses(
    global_model: GlobalModel, model: nn.Module, batch: EncodedBatch
) -> torch.Tensor:
    """Each example's loss in the client's arithmetic (what a per-sample defense clips)."""
    with client_arithmetic(global_model.protocol, global_model.device):
        return global_model.example_losses(model, batch)


def __getattr__(name: str) -> object:
    from gradleak.renamed import renamed_attribute

    return renamed_attribute(__name__, name)
