"""What of a received update is matched: its tensors, their gradient form, and which to leave out.

An update holds tensors by key; a key can also name a role slice (q, k, v) of a fused parameter
sent whole. The matched side is always a gradient: a FedAvg weight delta is put in gradient
units as the pseudo-gradient ``-delta / (local_steps * lr)``. Two kinds of tensor carry no
information about the input and may be left out: the token-embedding table, which dummy
*embeddings* bypass, and tensors whose received gradient is zero up to rounding.
"""

from __future__ import annotations

import torch

from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.sharing import TensorSpec, shared_tensor_specs
from gradleak.models.tasks import unwrap


def matchable_specs(update: UpdatePayload, gm: GlobalModel) -> dict[str, TensorSpec]:
    """Every tensor the update holds, by key: the tensors as sent, plus the role slices of a
    fused parameter sent whole, so ``--match`` can pick any subset of what was sent (a full
    GPT-2 update holds layer 0's q as a third of ``c_attn``)."""
    held = {s.key: s for s in gm.specs if s.key in update.tensors}
    whole = {s.param for s in held.values() if s.dim is None and s.key == s.param}
    try:
        roles = shared_tensor_specs(gm.model, gm.adapter, "*.qkvofp")
    except GradleakError:  # nothing trainable has a role (e.g. only a classifier head)
        roles = []
    for spec in roles:
        if spec.key not in held and spec.param in whole:
            held[spec.key] = spec
    return held


def received_tensor(update: UpdatePayload, spec: TensorSpec) -> torch.Tensor:
    """The tensor ``spec`` names, as sent or sliced from the fused parameter sent whole."""
    if spec.key in update.tensors:
        return update.tensors[spec.key]
    return spec.take(update.tensors[spec.param])


def as_gradient(update: UpdatePayload, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Tensors of ``update`` in gradient units: a gradient as is, a FedAvg weight delta as the
    pseudo-gradient ``-delta / (local_steps * lr)`` (exact for one SGD step, an approximation
    otherwise)."""
    if update.kind == "gradient":
        return tensors
    steps = update.metadata["local_steps"]
    lr = update.metadata["lr"]
    return [-t / (steps * lr) for t in tensors]


def is_token_embedding(spec: TensorSpec | None, gm: GlobalModel) -> bool:
    """The token-embedding table gets no gradient from dummy *embeddings*, so matching it only
    adds a constant; it is left out, as in LAMP (whose target gradient omits it too)."""
    if spec is None:
        return False
    table = gm.adapter.token_embedding(unwrap(gm.model)).weight
    return dict(gm.model.named_parameters()).get(spec.param) is table


def default_keys(update: UpdatePayload, specs: dict[str, TensorSpec], gm: GlobalModel) -> list[str]:
    """The keys matched unless the attacker picks: every tensor sent but the token table
    (``specs``: :func:`matchable_specs` of the update)."""
    return [k for k in update.tensors if not is_token_embedding(specs.get(k), gm)]


def null_keys(keys: list[str], targets: list[torch.Tensor]) -> list[str]:
    """Tensors whose received gradient is float noise (norm under 1e-6 of the median tensor's).

    The attention key bias is one: softmax ignores a shift shared by all keys, so its gradient is
    zero up to rounding. Under a scale-free distance (cosine) such a tensor adds a term that is
    pure rounding noise, different for every evaluation order of the same input.
    """
    norms = torch.stack([t.detach().float().norm() for t in targets])
    cut = 1e-6 * norms.median()
    return [k for k, n in zip(keys, norms.tolist(), strict=True) if n <= cut]


def hides_null_tensors(update: UpdatePayload) -> bool:
    """Whether the update cannot show which tensors are null: Adam divides by ``|g| + eps``, so
    it turns a gradient that is zero up to rounding into a step of ``lr |g| / eps``."""
    return update.kind == "weight_delta" and update.metadata.get("optimizer") == "adam"
