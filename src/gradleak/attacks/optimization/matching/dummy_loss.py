"""The task loss of dummy embeddings, as a module ``torch.func`` can run with other parameters."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.func import functional_call

from gradleak.models.tasks import task_loss

# The loss module holds the model as ``model``: its parameter names carry this prefix.
PREFIX = "model."


class TaskLoss(nn.Module):
    """The task loss as a module of (embeddings, labels, LM targets), so ``torch.func`` can
    swap in parameters; its parameters are the victim model's, prefixed with :data:`PREFIX`.

    ``attention_mask``/``token_type_ids`` default to the whole batch's; a simulated local batch
    passes its own rows'."""

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
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return task_loss(
            self.model,
            self.adapter,
            self.task,
            self.attention_mask if attention_mask is None else attention_mask,
            labels,
            inputs_embeds=embeds,
            token_type_ids=self.token_type_ids if token_type_ids is None else token_type_ids,
            lm_targets=lm_targets,
        )

    def with_parameters(
        self,
        params: dict[str, torch.Tensor],
        embeds: torch.Tensor,
        labels: dict[str, torch.Tensor],
        lm_targets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The loss with ``params`` (by the model's own names) in place of the model's."""
        named = {PREFIX + n: t for n, t in params.items()}
        return functional_call(self, named, (embeds, labels, lm_targets))


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """The model in eval mode for a probe (no dropout draw), its mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
