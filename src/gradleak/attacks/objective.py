"""The gradient-matching objective shared by DLG, TAG and (later) LAMP and partial matching.

Given dummy token embeddings, compute the gradient the client would have sent for them and its
distance to the received update, differentiably (``create_graph=True``), so the embeddings can
be optimized.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from gradleak.errors import GradleakError
from gradleak.federated.client import ClientUpdate, set_mode
from gradleak.federated.server import ServerKnowledge
from gradleak.federated.sharing import TensorSpec
from gradleak.models.tasks import task_loss, unwrap

Distance = Callable[[list[torch.Tensor], list[torch.Tensor]], torch.Tensor]


def l2_distance(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
    """DLG: sum over tensors of the squared L2 distance."""
    return sum(((d - t) ** 2).sum() for d, t in zip(dummy, target, strict=True))


def tag_distance(l1_weight: float = 0.01) -> Distance:
    """TAG: squared L2 plus ``l1_weight`` times L1 (the LAMP reference's weighting)."""

    def distance(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
        total = 0.0
        for d, t in zip(dummy, target, strict=True):
            diff = d - t
            total = total + (diff**2).sum() + l1_weight * diff.abs().sum()
        return total

    return distance


def cos_distance(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
    """Mean over tensors of 1 - cosine similarity (Geiping et al.; LAMP_cos)."""
    terms = [
        1 - torch.nn.functional.cosine_similarity(d.flatten(), t.flatten(), dim=0, eps=1e-12)
        for d, t in zip(dummy, target, strict=True)
    ]
    return torch.stack(terms).mean()


DISTANCES: dict[str, Distance] = {
    "l2": l2_distance,
    "tag": tag_distance(),
    "cos": cos_distance,
}


def target_gradients(update: ClientUpdate, keys: list[str]) -> list[torch.Tensor]:
    """The update as a gradient. A FedAvg weight delta becomes the pseudo-gradient
    ``-delta / (local_steps * lr)``: exact for one SGD step, an approximation otherwise."""
    tensors = [update.tensors[k] for k in keys]
    if update.kind == "gradient":
        return tensors
    steps = update.metadata["local_steps"]
    lr = update.metadata["lr"]
    return [-t / (steps * lr) for t in tensors]


def _is_token_embedding(spec: TensorSpec | None, gm) -> bool:
    """The token-embedding table gets no gradient from dummy *embeddings*, so matching it only
    adds a constant; it is left out, as in LAMP (whose target gradient omits it too)."""
    if spec is None:
        return False
    table = gm.adapter.token_embedding(unwrap(gm.model)).weight
    return dict(gm.model.named_parameters()).get(spec.param) is table


class GradientMatcher:
    """Computes dummy gradients on the attacker's own copy of the global model.

    ``mode`` is the attacker's model mode for dummy gradients: ``eval`` is Wang & Li's
    TRAIN_EVAL scenario when the client trained in train mode; ``train`` is their TRAIN.
    """

    def __init__(
        self,
        update: ClientUpdate,
        knowledge: ServerKnowledge,
        distance: Distance,
        mode: str = "eval",
        keys: list[str] | None = None,
    ) -> None:
        gm = knowledge.global_model
        self.knowledge = knowledge
        self.model: nn.Module = gm.copy_model()
        set_mode(self.model, mode)
        specs_by_key = {s.key: s for s in gm.specs}
        if keys is None:
            keys = [k for k in update.tensors if not _is_token_embedding(specs_by_key.get(k), gm)]
        self.keys = keys
        missing = [k for k in self.keys if k not in update.tensors or k not in specs_by_key]
        if missing:
            raise GradleakError(
                f"the update does not contain {missing[0]} (and {len(missing) - 1} more): "
                "match only tensors the client sends"
            )
        self.specs: list[TensorSpec] = [specs_by_key[k] for k in self.keys]
        params = dict(self.model.named_parameters())
        self.param_names = sorted({s.param for s in self.specs})
        self.params = [params[n] for n in self.param_names]
        for p in self.model.parameters():
            p.requires_grad_(False)
        for p in self.params:
            p.requires_grad_(True)
        self.targets = [t.detach() for t in target_gradients(update, self.keys)]
        self.distance = distance
        self.attention_mask = knowledge.attention_mask
        self.token_type_ids = knowledge.token_type_ids

    def dummy_gradients(
        self, embeds: torch.Tensor, lm_targets: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        gm = self.knowledge.global_model
        loss = task_loss(
            self.model,
            gm.adapter,
            gm.task,
            self.attention_mask,
            self.knowledge.labels or {},
            inputs_embeds=embeds,
            token_type_ids=self.token_type_ids,
            lm_targets=lm_targets,
        )
        grads = torch.autograd.grad(loss, self.params, create_graph=True, allow_unused=True)
        by_name = {
            n: torch.zeros_like(p) if g is None else g
            for n, p, g in zip(self.param_names, self.params, grads, strict=True)
        }
        return [s.take(by_name[s.param]) for s in self.specs]

    def loss(self, embeds: torch.Tensor, lm_targets: torch.Tensor | None = None) -> torch.Tensor:
        return self.distance(self.dummy_gradients(embeds, lm_targets), self.targets)
