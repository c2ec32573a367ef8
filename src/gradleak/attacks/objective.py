"""The gradient-matching objective shared by DLG, TAG, LAMP and partial matching.

Given dummy token embeddings, compute the gradient the client would have sent for them and its
distance to the received update, differentiably (``create_graph=True``), so the embeddings can
be optimized. LAMP also scores hundreds of candidate inputs per round without differentiating
through them: :meth:`GradientMatcher.batched_loss` does that with ``torch.func`` (one vectorized
gradient per candidate instead of a Python loop).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

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
    """Mean over tensors of 1 - cosine similarity (Geiping et al.; LAMP_cos).

    Written as one dot product and two norms per tensor: ``F.cosine_similarity`` materializes
    normalized copies of both tensors, which doubled the cost of scoring LAMP's candidates.
    """
    terms = []
    for d, t in zip(dummy, target, strict=True):
        d, t = d.flatten(), t.flatten()
        norms = torch.linalg.vector_norm(d) * torch.linalg.vector_norm(t)
        terms.append(1 - torch.dot(d, t) / norms.clamp_min(1e-12))
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


def _null_keys(keys: list[str], targets: list[torch.Tensor]) -> list[str]:
    """Tensors whose received gradient is float noise (norm under 1e-6 of the median tensor's).

    The attention key bias is one: softmax ignores a shift shared by all keys, so its gradient is
    zero up to rounding. Under a scale-free distance (cosine) such a tensor adds a term that is
    pure rounding noise, different for every evaluation order of the same input.
    """
    norms = torch.stack([t.detach().float().norm() for t in targets])
    cut = 1e-6 * norms.median()
    return [k for k, n in zip(keys, norms.tolist(), strict=True) if n <= cut]


class GradientMatcher:
    """Computes dummy gradients on the attacker's own copy of the global model.

    ``mode`` is the attacker's model mode for dummy gradients: ``eval`` is Wang & Li's
    TRAIN_EVAL scenario when the client trained in train mode; ``train`` is their TRAIN.
    ``skip_null_targets`` leaves out tensors whose received gradient is zero up to rounding
    (see :func:`_null_keys`); LAMP_cos uses it.
    """

    def __init__(
        self,
        update: ClientUpdate,
        knowledge: ServerKnowledge,
        distance: Distance,
        mode: str = "eval",
        keys: list[str] | None = None,
        labels: dict[str, torch.Tensor] | None = None,
        skip_null_targets: bool = False,
    ) -> None:
        gm = knowledge.global_model
        self.knowledge = knowledge
        self.model: nn.Module = gm.copy_model()
        set_mode(self.model, mode)
        specs_by_key = {s.key: s for s in gm.specs}
        if keys is None:
            keys = [k for k in update.tensors if not _is_token_embedding(specs_by_key.get(k), gm)]
        missing = [k for k in keys if k not in update.tensors or k not in specs_by_key]
        if missing:
            raise GradleakError(
                f"the update does not contain {missing[0]} (and {len(missing) - 1} more): "
                "match only tensors the client sends"
            )
        self.null_keys: list[str] = []
        if skip_null_targets:
            self.null_keys = _null_keys(keys, target_gradients(update, keys))
            keys = [k for k in keys if k not in self.null_keys] or keys
        self.keys = keys
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
        # The labels the dummy loss uses: the known ones, or an assignment under test when the
        # attack enumerates unknown labels.
        self.labels = labels if labels is not None else knowledge.labels
        self._loss_module = _TaskLoss(
            self.model, gm.adapter, gm.task, self.attention_mask, self.token_type_ids
        )

    def dummy_gradients(
        self,
        embeds: torch.Tensor,
        lm_targets: torch.Tensor | None = None,
        create_graph: bool = True,
    ) -> list[torch.Tensor]:
        loss = self._loss_module(embeds, self.labels or {}, lm_targets)
        grads = torch.autograd.grad(loss, self.params, create_graph=create_graph, allow_unused=True)
        by_name = {
            n: torch.zeros_like(p) if g is None else g
            for n, p, g in zip(self.param_names, self.params, grads, strict=True)
        }
        return [s.take(by_name[s.param]) for s in self.specs]

    def loss(
        self,
        embeds: torch.Tensor,
        lm_targets: torch.Tensor | None = None,
        create_graph: bool = True,
    ) -> torch.Tensor:
        grads = self.dummy_gradients(embeds, lm_targets, create_graph)
        return self.distance(grads, self.targets)

    def batched_loss(
        self,
        embeds: torch.Tensor,
        lm_targets: torch.Tensor | None = None,
        chunk: int = 0,
    ) -> torch.Tensor:
        """Matching loss of each candidate ``embeds[c]`` (``[C, B, L, d]``), not differentiable.

        The same number as :meth:`loss` per candidate, computed ``chunk`` candidates at a time
        with ``vmap`` over ``torch.func.grad``; ``chunk=0`` loops one by one (the reference's
        way, and the fallback for a model torch.func cannot trace). In train mode all candidates
        of a chunk share one dropout mask, so their comparison is not blurred by dropout noise.
        """
        if chunk <= 0:
            with torch.enable_grad():
                losses = [
                    self.loss(
                        embeds[c], None if lm_targets is None else lm_targets[c], False
                    ).detach()
                    for c in range(embeds.shape[0])
                ]
            return torch.stack(losses)
        params = {name: p.detach() for name, p in zip(self.param_names, self.params, strict=True)}
        labels = self.labels or {}
        module = self._loss_module

        def one(candidate: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
            def loss_of(p: dict[str, torch.Tensor]) -> torch.Tensor:
                named = {f"model.{n}": t for n, t in p.items()}
                return functional_call(module, named, (candidate, labels, targets))

            by_name = grad(loss_of)(params)
            return self.distance([s.take(by_name[s.param]) for s in self.specs], self.targets)

        batched = vmap(one, in_dims=(0, None if lm_targets is None else 0), randomness="same")
        out = []
        with torch.no_grad():
            for start in range(0, embeds.shape[0], chunk):
                part = slice(start, start + chunk)
                targets = None if lm_targets is None else lm_targets[part]
                out.append(batched(embeds[part], targets))
        return torch.cat(out)

    def gradient_numel(self) -> int:
        """Entries of the parameters whose gradient is computed (sizes batched scoring)."""
        return sum(p.numel() for p in self.params)


class _TaskLoss(nn.Module):
    """The task loss as a module of (embeddings, labels, LM targets), so ``torch.func`` can
    swap in parameters; its parameters are the victim model's, prefixed with ``model.``."""

    def __init__(self, model, adapter, task, attention_mask, token_type_ids) -> None:
        super().__init__()
        self.model = model
        self.adapter = adapter
        self.task = task
        self.attention_mask = attention_mask
        self.token_type_ids = token_type_ids

    def forward(
        self,
        embeds: torch.Tensor,
        labels: dict[str, torch.Tensor],
        lm_targets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return task_loss(
            self.model,
            self.adapter,
            self.task,
            self.attention_mask,
            labels,
            inputs_embeds=embeds,
            token_type_ids=self.token_type_ids,
            lm_targets=lm_targets,
        )
