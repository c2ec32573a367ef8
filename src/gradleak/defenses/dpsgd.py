"""DP-SGD (Abadi et al. 2016) through opacus: the defense of Li, Xu & Dras 2024 (section 4).

In every local step the client computes each example's gradient, clips it to norm ``clip``,
sums, adds Gaussian noise of standard deviation ``sigma * clip`` and divides by the number of
examples; FedSGD sends that one step's gradient, FedAvg steps with it. Opacus computes the
per-example gradients (``GradSampleHooks``; ghost clipping computes only their norms), and its
``DPOptimizer`` clips and noises them; its accountants give epsilon (:mod:`.privacy`).

Per-example gradients need three things opacus does not do by itself here:

* every trained layer must see one row of inputs per example. BERT and GPT-2 look their
  position embeddings up with ids of shape ``[1, L]`` that broadcast over the batch (opacus
  issue 841): such ids are expanded to ``[B, L]`` before the lookup;
* opacus records activations only in layers flagged as training. A client in eval mode keeps
  its eval forward (no dropout, no attention dropout: modules without parameters stay in
  eval) while the layers that hold trained parameters are flagged as training; none of these
  (linear, embedding, normalization layers) computes differently when flagged;
* a trainable parameter the loss does not reach has no per-example gradient: it counts as
  zero, and gets only noise.

The loss whose gradient is clipped is each example's own (``GlobalModel.example_losses``).
Nothing falls back to non-private training: what opacus cannot handle is an error.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from opacus.grad_sample import GradSampleHooks, GradSampleHooksFastGradientClipping
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
from torch import nn

from gradleak.defenses.base import SampleDefense
from gradleak.defenses.privacy import epsilon
from gradleak.defenses.settings import DpSgdSettings
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel
from gradleak.federated.private import PrivateGradients
from gradleak.runtime.devices import noise_generator

# Harmless warnings of a private step: opacus's full backward hooks on layers whose inputs
# are token ids, and functorch's autocast probe on CPU.
_QUIET = ("Full backward hook is firing", "In CPU autocast")


class DpSgd(SampleDefense[DpSgdSettings]):
    """DP-SGD in the client's local steps."""

    def grad_sample_mode(self, model: nn.Module) -> str:
        """The opacus mode used on ``model``: ``auto`` picks ghost clipping unless trained
        parameters are tied, which ghost clipping refuses."""
        mode = self.settings.grad_sample_mode
        if self.settings.observed == "before_noise":  # ghost clipping leaves no plain gradient
            if mode == "ghost":
                raise GradleakError(
                    "dpsgd's observed=before_noise reads the plain gradient, which ghost "
                    "clipping never forms: use grad_sample_mode=hooks or auto"
                )
            if mode == "auto":
                return "hooks"
        tied = _tied_parameters(model)
        if mode == "ghost" and tied:
            raise GradleakError(
                f"dpsgd's grad_sample_mode=ghost cannot clip tied parameters ({tied}): use "
                "grad_sample_mode=hooks or auto"
            )
        if mode == "auto":
            return "hooks" if tied else "ghost"
        return mode

    def noise_variance(
        self, variance: float, received: torch.Tensor, metadata: Mapping[str, Any]
    ) -> float:
        """Each step's gradient carries N(0, (sigma C)^2) over its batch of b examples:
        variance (sigma C / b)^2 per entry. FedSGD sends that gradient; an SGD FedAvg delta
        is -lr times the sum of its steps' gradients, so their variances add, times lr^2.
        Adam rescales each step by the noise itself: that delta's noise is not sized here
        (the variance passes unchanged, and an attack sees an unsized spectrum).
        Under secure aggregation ``n_samples`` is all clients'; each client's is its share."""
        clients = int(metadata.get("aggregated_clients", 1))
        n = int(metadata.get("n_samples", 0)) // clients
        if n < 1 or self.settings.sigma == 0 or self.settings.observed == "before_noise":
            return variance
        per_example = (self.settings.sigma * self.settings.clip) ** 2
        if metadata.get("algorithm", "fedsgd") == "fedsgd":
            return variance + per_example / n**2
        if metadata.get("optimizer", "sgd") != "sgd":
            return variance
        b = min(int(metadata.get("local_batch_size") or n), n)
        batches = [b] * (n // b) + ([n % b] if n % b else [])
        epochs = int(metadata.get("epochs", 1))
        lr = float(metadata.get("lr", 0.0))
        return variance + lr**2 * epochs * sum(per_example / size**2 for size in batches)

    def attach(self, model: nn.Module, generator: torch.Generator) -> PrivateGradients:
        return _OpacusGradients(self.settings, self.grad_sample_mode(model), model, generator)

    def facts(self, global_model: GlobalModel, n_samples: int) -> dict[str, Any]:
        """Epsilon of the client's round on ``n_samples`` examples. FedSGD: one step on the
        whole batch (q = 1); FedAvg: its local steps, each on b of the n_k examples
        (q = b / n_k; the client shuffles rather than Poisson-samples, as is usual)."""
        s, protocol = self.settings, global_model.protocol
        local_batch = n_samples
        if protocol.algorithm == "fedavg":
            local_batch = min(protocol.local_batch_size or n_samples, n_samples)
        q, steps = local_batch / n_samples, protocol.local_steps(n_samples)
        delta = s.delta if s.delta is not None else 1.0 / n_samples
        sampling = "the whole batch"
        if q < 1:
            sampling = "shuffled local batches, accounted as Poisson sampling"
        facts: dict[str, Any] = {
            "defense": s.name,
            "epsilon": None,
            "delta": delta,
            "accountant": s.accountant,
            "sample_rate": q,
            "sampling": sampling,
            "steps": steps,
            "noise_multiplier": s.sigma,
            "clip": s.clip,
            "grad_sample_mode": self.grad_sample_mode(global_model.model),
        }
        if s.observed == "before_noise":
            facts["observed"] = s.observed
            facts["note"] = (
                "the attack read the gradient before opacus clipped and noised it (what Li, Xu "
                "& Dras's code attacked), not the update a DP-SGD client sends"
            )
        if s.sigma == 0:
            facts["note"] = "no noise (sigma 0): no privacy guarantee"
        elif delta >= 1:
            facts["note"] = "delta = 1/n_k = 1 guarantees nothing: pass delta"
        else:
            facts["epsilon"] = epsilon(s.accountant, s.sigma, q, steps, delta)
        return facts


def _tied_parameters(model: nn.Module) -> str:
    """Names of trained parameters that several modules share, comma-joined ('' if none)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if param.requires_grad:
            names.setdefault(id(param), []).append(name)
    return ", ".join(" = ".join(n) for n in names.values() if len(n) > 1)


class _OpacusGradients(PrivateGradients):
    """Opacus's per-example gradients and DP optimizer on one model, for one client round.

    The optimizer wrapped here never steps (its learning rate is 0): it only writes the
    clipped, noised mean gradient into ``.grad`` (``pre_step``); the client steps its own.
    """

    def __init__(
        self, settings: DpSgdSettings, mode: str, model: nn.Module, generator: torch.Generator
    ) -> None:
        self.model, self.mode, self.observed = model, mode, settings.observed
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.batch_size = 0
        self.flags = [(m, m.training) for m in model.modules() if _holds_trained_parameters(m)]
        for module, _ in self.flags:
            module.training = True
        self.handles = []
        self.hooks = None
        unsupported = _layers_with_buffers(model)
        if unsupported:
            self.close()
            raise GradleakError(
                f"opacus cannot compute per-example gradients of {unsupported}, a trained "
                "layer with buffers: freeze it to use dpsgd"
            )
        try:
            if mode == "ghost":
                self.hooks = GradSampleHooksFastGradientClipping(
                    model, loss_reduction="mean", max_grad_norm=settings.clip
                )
            else:
                self.hooks = GradSampleHooks(
                    model, loss_reduction="mean", force_functorch=mode == "functorch"
                )
        except NotImplementedError as exc:
            self.close()
            raise GradleakError(
                f"opacus cannot compute per-example gradients of this model ({_first(exc)}): "
                "freeze that layer (e.g. freeze_embeddings, LoRA) to use dpsgd"
            ) from None
        # after opacus's hooks: functorch copies layers as they are when hooked
        self.handles = [
            module.register_forward_pre_hook(self._one_row_per_example)
            for module in model.modules()
            if isinstance(module, nn.Embedding) and module.weight.requires_grad
        ]
        optimizer = DPOptimizerFastGradientClipping if mode == "ghost" else DPOptimizer
        self.optimizer = optimizer(
            torch.optim.SGD(self.params, lr=0.0),
            noise_multiplier=settings.sigma,
            max_grad_norm=settings.clip,
            expected_batch_size=1,
            loss_reduction="mean",
            generator=noise_generator(generator, self.params[0].device),
        )

    def gradient(self, example_losses: Callable[[], torch.Tensor], batch_size: int) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer.expected_batch_size = self.batch_size = batch_size
        with warnings.catch_warnings():
            for message in _QUIET:
                warnings.filterwarnings("ignore", message)
            if self.mode == "ghost":
                for p in self.params:  # zero for parameters the loss does not reach
                    p._norm_sample = p.new_zeros(batch_size)
                losses = example_losses()
                try:
                    DPTensorFastGradientClipping(self.hooks, self.optimizer, losses).backward()
                except NotImplementedError as exc:  # a layer used twice in one forward
                    raise GradleakError(
                        f"dpsgd's ghost clipping cannot handle this model ({_first(exc)}): use "
                        "grad_sample_mode=hooks"
                    ) from None
                for p in self.params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
            else:
                example_losses().mean().backward()
                for p in self.params:
                    if p.grad_sample is None:
                        p.grad_sample = p.new_zeros((batch_size, *p.shape))
        plain = None
        if self.observed == "before_noise":  # the labelled replication reads the plain mean
            plain = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in self.params]
        self.optimizer.pre_step()  # writes the clipped, noised mean into .grad
        for p, grad in zip(self.params, plain or (), strict=False):
            p.grad = grad

    def _one_row_per_example(self, module: nn.Module, args: tuple) -> tuple | None:
        """Expand ids shared by the whole batch (position ids of shape ``[1, L]``) to one row
        per example, so that the embedding's per-example gradient is defined."""
        ids = args[0]
        if ids.shape[0] == self.batch_size:
            return None
        if ids.shape[0] == 1:
            return (ids.expand(self.batch_size, *ids.shape[1:]).contiguous(), *args[1:])
        raise GradleakError(
            f"dpsgd needs one row of inputs per example in every trained layer, but an "
            f"embedding of {module.num_embeddings} rows receives ids of shape "
            f"{tuple(ids.shape)} for a batch of {self.batch_size}: freeze it"
        )

    def close(self) -> None:
        if self.hooks is not None:
            self.hooks.cleanup()
            self.hooks = None
        for p in self.params:
            if hasattr(p, "summed_grad"):
                del p.summed_grad
        for module in self.model.modules():
            for attribute in ("activations", "max_batch_len"):
                if hasattr(module, attribute):
                    delattr(module, attribute)
        for handle in self.handles:
            handle.remove()
        self.handles = []
        for module, training in self.flags:
            module.training = training


def _layers_with_buffers(model: nn.Module) -> str:
    """Names of layers that hold trained parameters and buffers (batch norm's running
    statistics, say), which opacus refuses; '' if none."""
    return ", ".join(
        f"{name} ({type(module).__name__})"
        for name, module in model.named_modules()
        if _holds_trained_parameters(module) and next(module.buffers(), None) is not None
    )


def _holds_trained_parameters(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters(recurse=False))


def _first(exc: BaseException) -> str:
    """The first line of an opacus error (which may hold a list of errors)."""
    inner = exc.args[0] if exc.args else exc
    if isinstance(inner, list) and inner:
        inner = inner[0]
    return str(inner).strip().splitlines()[0] if str(inner).strip() else type(exc).__name__
