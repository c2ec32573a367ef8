"""When DAGER cannot be exact, and the one line that says why and what to change.

* the model: a two-layer classifier leaves its second layer's span short of its inputs;
* public sign compression: the signs of a rank-r gradient are not of rank r (``sign`` is not
  linear), so no span is left to check; pruning whose zeros later noise hides;
* an Adam client's delta: each entry of its steps is divided by its own running scale, so it is
  no sum of input outer products, full-model or LoRA (a LoRA delta's few rows would otherwise
  pass for a slice of the inputs' span and give tokens at random);
* a span of full rank (the batch, a float32 delta cut below its rounding, a
  defense's noise), or the rows pruning kept whole too few to span the inputs (``check.py``).
  So is a multi-step FedAvg delta whose extra directions (inputs that moved between local
  steps) lie above its rounding noise: approximate without pruning, unverifiable with it.
"""

from __future__ import annotations

from typing import Any

import torch

from gradleak.attacks.adaptive import KEPT_COORDINATES, SIGN, adaptation_for, defense_names
from gradleak.attacks.base import Refusal
from gradleak.attacks.dager.check import LayerCheck
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel
from gradleak.federated.payload import UpdatePayload
from gradleak.models.tasks import unwrap

ADAM_REFUSAL = (
    "dager cannot run on this update: an Adam client divides each entry of its steps by that "
    "entry's own running scale (its first step is about lr times the gradient's sign), so its "
    "delta is no sum of input outer products and holds no span of the inputs: attack a client "
    "that steps with SGD (--optimizer sgd) or sends gradients, or an optimization attack with "
    "--fedavg-match simulate"
)

SIGN_REFUSAL = (
    "dager cannot run on this update: sign compression destroys the low-rank structure "
    "DAGER's span check needs (the signs of a low-rank gradient have full rank)"
)


def require_scenario(gm: GlobalModel) -> None:
    """Raise when DAGER can never be exact for this model, whatever the batch."""
    if gm.adapter is None:
        raise GradleakError("dager needs a model family with an adapter")
    if (
        gm.task == "classification"
        and not gm.adapter.rotary_positions
        and gm.adapter.num_layers(unwrap(gm.model)) <= 2
    ):
        # A classification loss reads one position of the last layer, so there every key
        # gradient is parallel to that one query and every value gradient to one output
        # per head: the second layer's span misses tokens when it is the last layer.
        # (Rotary positions rotate each key differently and keep the rank.)
        raise GradleakError(
            f"dager's second-layer check needs a layer after it, and this "
            f"{gm.adapter.family} model has only 2 layers with a one-position "
            "classification loss: attack a model with 3 or more layers or use --task causal_lm"
        )


HIDDEN_PRUNING_REFUSAL = (
    "dager cannot be exact here: noise after pruning hides which coordinates pruning zeroed, "
    "and rows that pruning cut partly leave the inputs' span: attack a pruned update without "
    "noise after it"
)


def optimizer_refusal(update: UpdatePayload) -> Refusal | None:
    """A refusal when the client's optimizer left no span in its delta (Adam)."""
    return Refusal(ADAM_REFUSAL) if _adam_delta(update) else None


def defense_refusal(defenses: tuple[Any, ...]) -> Refusal | None:
    """A refusal when the public defenses leave no span to check: sign compression, or
    pruning whose zeros later noise covers up."""
    adaptation = adaptation_for(defenses)
    if adaptation == SIGN:
        return Refusal(SIGN_REFUSAL)
    pruned = "prune" in defense_names(defenses)
    if pruned and adaptation != KEPT_COORDINATES:
        return Refusal(HIDDEN_PRUNING_REFUSAL)
    return None


def pruning_refusal(check: LayerCheck, layer: int) -> Refusal | None:
    """A refusal when the rows pruning kept whole do not span the layer's inputs."""
    if all(c.saturated for c in check.checks):
        return None
    rows = sum(c.whole_rows or 0 for c in check.checks if not c.saturated)
    rank = max(c.span.rank for c in check.checks if not c.saturated)
    return Refusal(
        f"dager cannot be exact here: the {rows} rows of layer {layer + 1}'s q/k/v update that "
        f"pruning kept whole do not show that their span (rank {rank}) holds every input (that "
        "needs more whole rows than the rank, dependent up to rounding; partly pruned rows "
        "leave the span): use a larger keep or a smaller --batch-size"
    )


def full_rank_refusal(
    check: LayerCheck,
    layer: int,
    defenses: tuple[Any, ...] = (),
    update: UpdatePayload | None = None,
    rank_tol: float | None = None,
) -> Refusal | None:
    """A refusal when one of the layer's spans is full, naming what can fill it: the client's
    public ``defenses``, the rounding of a float32 weight delta cut by
    a fixed ``rank_tol`` (the default cut sits above that rounding), or the batch itself."""
    for one in check.checks:
        if not one.span.full:
            continue
        limit = "LoRA rank" if one.transform is not None else "hidden size"
        cause = f"the batch holds at least as many distinct tokens as the {limit}"
        fix = "use a smaller --batch-size or shorter inputs"
        if update is not None and rank_tol is not None and _float32_delta(update):
            cause = (
                "a float32 client's weight delta is partly the rounding of its stored weights, "
                f"which fills every direction above --rank-tol {rank_tol:g}, or {cause}"
            )
            fix = "leave --rank-tol at its default (the rounding floor), or " + fix
        if defenses:
            names = "+".join(d.name for d in defenses)
            cause = f"the client's defense ({names}) fills every direction, or {cause}"
        return Refusal(
            f"dager cannot be exact here: layer {layer + 1}'s update has full rank "
            f"{one.span.rank} ({cause}): {fix}"
        )
    return None


def _adam_delta(update: UpdatePayload) -> bool:
    """Whether ``update`` is the weight delta of a client that stepped with Adam."""
    return update.kind == "weight_delta" and update.metadata.get("optimizer") == "adam"


def _float32_delta(update: UpdatePayload) -> bool:
    """Whether ``update`` is a FedAvg weight delta computed in float32 (or coarser)."""
    if update.kind != "weight_delta" or not update.tensors:
        return False
    return next(iter(update.tensors.values())).dtype != torch.float64
