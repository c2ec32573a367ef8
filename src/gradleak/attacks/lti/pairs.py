"""LTI's training pairs: (hashed, defended update of the global model on a server-made batch,
that batch's tokens).

The server knows the global model, the protocol, the public defenses and, as every attack
here may, the private batch's lengths and labels when the scenario declares them known. It
makes batches of the same shape as the client's: the known template (the tokenizer's own
tokens at their positions) with its free positions filled either by auxiliary text (LTI) or
by tokens drawn i.i.d. from a public marginal token distribution (LTI-P). For each batch it
computes the update the client would have sent, in the client's mode, and applies the public
defenses the client applies, so the inversion model learns to invert defended updates.

Many batches go through at once: ``torch.func.vmap`` over ``grad`` gives one gradient per
batch from one vectorized pass, and each chunk is defended and hashed before the next is
computed, so no set of full gradients larger than a chunk is ever held. A chunk holds at most
``CHUNK_COORDINATES`` gradient coordinates (1 GiB of float32); why the bound is needed: see
docs/design/lti.md.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from gradleak.attacks.lti.hashing import FeatureHasher
from gradleak.defenses import Defense, build_defenses
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel, client_mode, update_metadata
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.models.tasks import task_loss

CHUNK_COORDINATES = 2**28


class _IdsLoss(nn.Module):
    """The client's task loss of token ids, as a module ``torch.func`` can swap weights in."""

    def __init__(self, global_model: GlobalModel) -> None:
        super().__init__()
        self.model = global_model.model
        self.adapter = global_model.adapter
        self.task = global_model.task

    def forward(self, ids, mask, labels, token_type_ids):
        label_dict = {} if labels is None else {"label": labels}
        return task_loss(
            self.model, self.adapter, self.task, mask, label_dict,
            input_ids=ids, token_type_ids=token_type_ids,
        )  # fmt: skip


class UpdateSampler:
    """The client's defended update for server-made batches ``[N, B, L]``, hashed: ``[N, k]``.

    ``keys`` are the update's tensors the features read, in the update's order (what the
    inversion model sees must be what the client sends: shared tensors only, and no tensor
    that a tied embedding makes a copy of another)."""

    def __init__(
        self,
        knowledge: ServerKnowledge,
        keys: Sequence[str],
        hasher: FeatureHasher,
        mode: str,
    ) -> None:
        gm = knowledge.global_model
        self.global_model, self.knowledge, self.mode, self.hasher = gm, knowledge, mode, hasher
        by_key = {s.key: s for s in gm.specs}
        self.specs = [by_key[key] for key in keys]
        names = {s.param for s in self.specs}
        self.params = {n: p.detach() for n, p in gm.model.named_parameters() if n in names}
        self.loss = _IdsLoss(gm)
        self.defenses = build_defenses(knowledge.defenses)
        require_modelled(self.defenses)

    @functools.cached_property
    def size(self) -> int:
        """Coordinates of one update's features (before hashing)."""
        params = dict(self.global_model.model.named_parameters())
        return sum(s.take(params[s.param]).numel() for s in self.specs)

    def _one(self, params, ids, mask, labels, token_type_ids) -> list[torch.Tensor]:
        named = {"model." + n: t for n, t in params.items()}

        def loss(weights):
            merged = {**named, **{"model." + n: t for n, t in weights.items()}}
            return functional_call(self.loss, merged, (ids, mask, labels, token_type_ids))

        by_name = grad(loss)(params)
        return [s.take(by_name[s.param]) for s in self.specs]

    def gradients(self, ids: torch.Tensor, labels: torch.Tensor | None) -> list[torch.Tensor]:
        """The update's tensors for each of ``N`` batches ``ids`` (``[N, B, L]``, the known
        lengths' shape: one attention mask serves them all), each ``[N, ...]``, undefended."""
        mask, types = self.knowledge.attention_mask, self.knowledge.token_type_ids
        randomness = "different" if self.mode == "train" else "error"
        batched = vmap(
            self._one,
            in_dims=(None, 0, None, None if labels is None else 0, None),
            randomness=randomness,
        )
        with client_mode(self.global_model.model, self.mode):
            return [g.detach() for g in batched(self.params, ids, mask, labels, types)]

    def defended(
        self, tensors: list[torch.Tensor], generator: torch.Generator
    ) -> list[torch.Tensor]:
        """Each batch's update through the public defenses, as the client applies them."""
        if not self.defenses:
            return tensors
        rows = UpdatePayload(
            kind="gradient",
            tensors={s.key: t for s, t in zip(self.specs, tensors, strict=True)},
            metadata=update_metadata(self.global_model, self.knowledge.batch_size),
        )
        for defense in self.defenses:  # per-update defenses only (require_modelled)
            rows.tensors = defense.apply_rows(rows, generator)
        return [rows.tensors[s.key] for s in self.specs]

    def features(
        self,
        ids: torch.Tensor,
        labels: torch.Tensor | None,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """Hashed, defended updates of ``N`` batches: ``[N, k]``, computed a chunk at a time
        (see the module's docstring)."""
        per_chunk = max(1, CHUNK_COORDINATES // max(1, self.size))
        hashed = []
        for start in range(0, ids.shape[0], per_chunk):
            part = ids[start : start + per_chunk]
            part_labels = None if labels is None else labels[start : start + per_chunk]
            tensors = self.defended(self.gradients(part, part_labels), generator)
            hashed.append(self.hasher.hash_blocks(tensors, batch=part.shape[0]))
            del tensors
        return hashed[0] if len(hashed) == 1 else torch.cat(hashed)


def require_modelled(defenses: Sequence[Defense], attack: str = "lti") -> None:
    """LTI trains on updates defended as the client's are: it can apply per-update defenses
    (noise, prune, sign) to its own updates, not those that act inside the client's steps or
    across clients."""
    unsupported = [d.name for d in defenses if d.stage != "per_update"]
    if unsupported:
        raise GradleakError(
            f"{attack} trains on updates defended as the client's are and models per-update "
            f"defenses (noise, prune, sign), not {', '.join(unsupported)}: attack with dager or "
            "the optimization attacks, or declare that defense private"
        )


def update_features(
    update: UpdatePayload, keys: Sequence[str], hasher: FeatureHasher
) -> torch.Tensor:
    """The features of a received update: its ``keys`` tensors in order, hashed (``[k]``)."""
    missing = [key for key in keys if key not in update.tensors]
    if missing:
        raise GradleakError(f"the update lacks {missing[0]}, which the inversion model reads")
    return hasher.hash_blocks([update.tensors[key] for key in keys])
