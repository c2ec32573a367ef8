"""What is trained and what is sent: full fine-tuning, LoRA, frozen embeddings, partial sharing.

The selection syntax for ``share`` is ``all`` or a comma-separated list of ``LAYERS.MODULES``
items: LAYERS is ``*``, ``3`` or ``0-2``; MODULES is a subset of ``qkvofp`` (Li, Xu & Dras:
q, k, v attention projections, o attention output, f FFN in, p FFN out). Example: ``3.qv,*.f``.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from gradleak.errors import GradleakError, one_line
from gradleak.federated.protocol import LoraSettings, Protocol
from gradleak.models.adapters import ModelAdapter, RoleModule
from gradleak.models.roles import ROLES
from gradleak.models.tasks import unwrap

_ITEM = re.compile(r"^(\*|[0-9]{1,6}|[0-9]{1,6}-[0-9]{1,6})\.([qkvofp]+)$")  # ASCII layer numbers


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the update: a trainable parameter, or a slice of a fused one.

    ``key`` names it in the update; ``param`` is the parameter's name in the trainable model;
    ``dim``/``start``/``stop`` cut GPT-2's fused q/k/v apart.
    """

    key: str
    param: str
    dim: int | None = None
    start: int = 0
    stop: int = 0
    layer: int | None = None
    role: str | None = None

    def take(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.dim is None:
            return tensor
        return tensor.narrow(self.dim, self.start, self.stop - self.start)


def parse_share(share: str, num_layers: int) -> set[tuple[int, str]] | None:
    """Parse a selection into (layer, role) pairs; ``None`` means every trainable tensor."""
    share = share.strip()
    if share == "all":
        return None
    chosen: set[tuple[int, str]] = set()
    for item in filter(None, (part.strip() for part in share.split(","))):
        match = _ITEM.match(item)
        if not match:
            raise GradleakError(
                f"bad --share item '{one_line(item[:80])}': use all, or LAYERS.MODULES like 3.qv, "
                "0-2.f, *.qkvofp"
            )
        layers_text, roles = match.groups()
        if layers_text == "*":
            layers = range(num_layers)
        else:
            first, _, last = layers_text.partition("-")
            layers = range(int(first), int(last or first) + 1)
        if layers.stop > num_layers or layers.start >= layers.stop:
            raise GradleakError(
                f"--share item '{item}' names layers outside 0-{num_layers - 1} of this model"
            )
        chosen.update((layer, role) for layer in layers for role in roles)
    if not chosen:
        raise GradleakError("--share selects nothing: use all, or items like 3.qv")
    return chosen


def _role_index(
    hf_model: nn.Module, adapter: ModelAdapter
) -> dict[int, list[tuple[int, str, RoleModule]]]:
    """Module identity -> the (layer, role) uses of that module."""
    index: dict[int, list[tuple[int, str, RoleModule]]] = {}
    for layer in range(adapter.num_layers(hf_model)):
        for role in ROLES:
            rm = adapter.role_module(hf_model, layer, role)
            index.setdefault(id(rm.module), []).append((layer, role, rm))
    return index


def _fused_spec(name: str, param: torch.Tensor, rm: RoleModule, fused_size: int, layer, role):
    """Slice of a fused projection's parameter along the dimension of size ``fused_size``."""
    dims = [d for d, size in enumerate(param.shape) if size == fused_size]
    if not dims:  # e.g. LoRA's A matrix of a fused layer: shared by q, k and v
        return TensorSpec(key=f"{name}[{role}]", param=name, layer=layer, role=role)
    width = fused_size // rm.parts
    return TensorSpec(
        key=f"{name}[{role}]",
        param=name,
        dim=dims[0],
        start=rm.part * width,
        stop=(rm.part + 1) * width,
        layer=layer,
        role=role,
    )


def shared_tensor_specs(
    model: nn.Module, adapter: ModelAdapter, share: str = "all"
) -> list[TensorSpec]:
    """The tensors a client sends: trainable parameters, narrowed to the chosen roles."""
    hf = unwrap(model)
    selection = parse_share(share, adapter.num_layers(hf))
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if selection is None:
        return [TensorSpec(key=n, param=n) for n, _ in trainable]
    role_index = _role_index(hf, adapter)
    role_of_param: dict[str, list[tuple[int, str, RoleModule]]] = {}
    for mod_name, module in model.named_modules():
        if id(module) in role_index:
            for p_name, _ in module.named_parameters():
                role_of_param[f"{mod_name}.{p_name}"] = role_index[id(module)]
    specs: list[TensorSpec] = []
    for name, param in trainable:
        for layer, role, rm in role_of_param.get(name, []):
            if (layer, role) not in selection:
                continue
            if rm.fused:
                fused_size = _fused_output_size(rm.module)
                specs.append(_fused_spec(name, param, rm, fused_size, layer, role))
            else:
                specs.append(TensorSpec(key=name, param=name, layer=layer, role=role))
    if not specs:
        raise GradleakError(
            f"--share '{share}' selects no trainable tensor (with LoRA, only the LoRA roles "
            "are trainable): choose roles that are trained"
        )
    return specs


def _fused_output_size(module: nn.Module) -> int:
    base = getattr(module, "base_layer", module)  # a LoRA-wrapped layer keeps the original
    if hasattr(base, "nf"):  # transformers Conv1D
        return int(base.nf)
    return int(base.out_features)


def _module_names(model: nn.Module, modules: list[nn.Module]) -> list[str]:
    wanted = {id(m) for m in modules}
    return [name for name, m in model.named_modules() if id(m) in wanted]


def apply_training_setup(model: nn.Module, adapter: ModelAdapter, protocol: Protocol) -> nn.Module:
    """Set dropout, freeze embeddings and wrap with LoRA as the protocol says.

    Returns the trainable model (a peft model with LoRA). The LoRA adapters' random init is
    part of the global model the server distributes, so it is drawn before any client runs.
    """
    if protocol.dropout is not None:
        adapter.set_dropout(model, protocol.dropout)
    if protocol.freeze_embeddings:
        for module in adapter.embedding_modules(model):
            module.requires_grad_(False)
    if protocol.lora is not None:
        model = _wrap_lora(model, adapter, protocol.lora)
    return model


def _wrap_lora(model: nn.Module, adapter: ModelAdapter, lora: LoraSettings) -> nn.Module:
    modules = [
        adapter.role_module(model, layer, role).module
        for layer in range(adapter.num_layers(model))
        for role in lora.roles
    ]
    names = sorted(set(_module_names(model, modules)))
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.scale_alpha,
        target_modules=names,
        lora_dropout=0.0,
        bias="none",
        fan_in_fan_out=adapter.family == "gpt2",
    )
    with warnings.catch_warnings():  # peft still reads a renamed transformers property
        warnings.filterwarnings(
            "ignore", "`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        return get_peft_model(model, config)
