"""Several clients' updates attacked in one stacked pass.

A step of LAMP or DLG on one short sentence leaves most of a core idle: small matrix products
pay per-operation overhead, not arithmetic. Stacking ``P`` independent problems (each one client
update, with its own target, labels, length and ``B`` rows) into one batch of ``P * B`` rows pays
that overhead once per step for all of them.

Why each problem's result is its one-by-one result, up to floating-point summation order:

* rows of a transformer batch do not interact (no batch statistics), and the padding of a
  shorter problem to the stack's width is masked out of attention (its weight is exactly zero)
  and feeds no loss, so its output gradient is zero and it adds nothing to any statistic;
* the ghost statistics (:mod:`gradleak.attacks.optimization.ghost.statistics`), or for a distance
without a statistics
  form (TAG's L2 + L1) the gradients formed from the same captures, are
  computed per group, a group being one problem's rows, against that problem's own target;
* the stacked loss is the sum of the problems' losses, whose gradient in one problem's
  embeddings is that problem's own gradient; and Adam is elementwise, so one Adam over the
  stacked embeddings takes every problem's own steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradleak.attacks.optimization.ghost.statistics import GhostStatistics
from gradleak.attacks.optimization.workspace import Workspace, project_to_tokens


def stack_key(ws: Workspace) -> tuple | None:
    """What problems must share to go in one stack; None when this one cannot be stacked.

    The same matched tensors (one ghost rule each), the same rows per problem (each group's
    loss is the stacked mean times the number of groups, which needs equal groups), and for a
    causal LM the same number of predicted tokens (its loss is a mean over tokens). A
    train-mode attacker's per-step dropout draws, a distance with no per-group form (the
    per-tensor normalized ones) and a model the captures do not follow run one by one."""
    matcher = ws.matcher
    distance = matcher.distance
    if matcher.model.training or (distance.from_statistics is None and distance.grouped is None):
        return None
    if matcher.captures is None:
        return None
    rows, _ = ws.template.shape
    tokens = None
    if matcher.knowledge.global_model.task == "causal_lm":
        tokens = int(matcher.attention_mask[:, 1:].sum())
    return (tuple(matcher.keys), rows, tokens)


@dataclass
class StackedObjective:
    """The matching losses of ``P`` stacked problems, one forward and backward for all.

    ``template``, ``fixed`` and ``free_mask`` are the problems' own, right-padded to the widest
    (``[P, B, W, ...]``); the padding is fixed, masked out of attention and never projected."""

    workspaces: list[Workspace]
    ghost: GhostStatistics
    template: torch.Tensor  # [P, B, W]: known ids (padding included), -1 at free positions
    fixed: torch.Tensor  # [P, B, W, d]
    attention_mask: torch.Tensor  # [P * B, W]
    token_type_ids: torch.Tensor | None  # [P * B, W]
    labels: dict[str, torch.Tensor]  # each [P * B]
    targets: list[torch.Tensor]  # each matched tensor's targets, [P, *shape]

    @classmethod
    def build(cls, workspaces: list[Workspace]) -> StackedObjective:
        """Stack problems that share a :func:`stack_key` (the caller groups them)."""
        first = workspaces[0].matcher
        width = max(ws.template.shape[1] for ws in workspaces)
        tokenizer = first.knowledge.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

        def padded(tensor: torch.Tensor, value: int) -> torch.Tensor:
            extra = width - tensor.shape[1]
            return torch.nn.functional.pad(tensor, (0, extra), value=value)

        template = torch.stack([padded(ws.template, pad) for ws in workspaces])
        embedding = workspaces[0].embedding
        masks = [padded(ws.matcher.attention_mask, 0) for ws in workspaces]
        types = None
        if first.token_type_ids is not None:
            types = torch.cat([padded(ws.matcher.token_type_ids, 0) for ws in workspaces])
        labels = {
            key: torch.cat([ws.matcher.labels[key] for ws in workspaces])
            for key in (first.labels or {})
        }
        targets = [
            torch.stack([ws.matcher.targets[k] for ws in workspaces])
            for k in range(len(first.targets))
        ]
        return cls(
            workspaces=workspaces,
            ghost=GhostStatistics(
                first.model,
                first.specs,
                targets,
                per_group=True,
                dtype=first.distance.statistics_dtype,
            ),
            template=template,
            fixed=embedding[template.clamp(min=0)],
            attention_mask=torch.cat(masks),
            token_type_ids=types,
            labels=labels,
            targets=targets,
        )

    @property
    def free_mask(self) -> torch.Tensor:
        return (self.template < 0)[..., None]

    def pad(self, frees: list[torch.Tensor]) -> torch.Tensor:
        """The problems' free embeddings (``[B, L_p, d]`` each) as one ``[P, B, W, d]``."""
        stacked = self.fixed.new_zeros(self.fixed.shape)
        for p, free in enumerate(frees):
            stacked[p, :, : free.shape[1]] = free
        return stacked

    def view(self, free: torch.Tensor, p: int) -> torch.Tensor:
        """Problem ``p``'s part of the stacked ``free`` (a view: edits write through)."""
        return free[p, :, : self.workspaces[p].template.shape[1]]

    def losses(self, free: torch.Tensor, create_graph: bool = True) -> torch.Tensor:
        """Each problem's matching loss (``[P]``) for the stacked free embeddings."""
        first = self.workspaces[0]
        embeds = torch.where(self.free_mask, free, self.fixed)
        problems, rows = embeds.shape[:2]
        flat = embeds.flatten(0, 1)
        ids = None
        if first.needs_ids:
            projected = project_to_tokens(free.detach(), first.embedding, first.allowed)
            ids = torch.where(self.template >= 0, self.template, projected).flatten(0, 1)
        module = first.matcher.task_loss

        def loss_of() -> torch.Tensor:
            return module(flat, self.labels, ids, self.attention_mask, self.token_type_ids)

        distance, count = first.matcher.distance, problems * rows
        if distance.from_statistics is not None:
            inner, norm = self.ghost.statistics(loss_of, count, problems, create_graph)
            return distance.from_statistics(inner, norm, self.ghost.target_norms)
        if distance.entrywise_l1 is not None:
            return self.ghost.streamed_l2_l1(
                loss_of, count, problems, distance.entrywise_l1, distance.grouped, create_graph
            )
        grads = self.ghost.gradients(loss_of, count, problems, create_graph)
        return distance.grouped(grads, self.targets)
