"""Scoring many candidate inputs of one matcher at once: LAMP's start (500 draws and 500
orders) and its discrete rounds, which need each candidate's matching loss but no gradient.

Candidates are stacked into one batch: on the ghost path (cosine, squared L2) each group keeps
its own statistics (:mod:`gradleak.attacks.optimization.ghost.statistics`); for squared L2 plus L1
(LAMP_L2+L1) each group's ``G - T`` is streamed from the captures
(:mod:`gradleak.attacks.optimization.ghost.streamed`); otherwise ``vmap`` forms every candidate's
gradient, or a loop forms them one by one (the reference's way). :class:`CandidateScoring` is a part
of :class:`~gradleak.attacks.optimization.matching.objective.GradientMatcher`, kept here so that
file says what is matched and this one how many candidates are scored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.func import grad, vmap

from gradleak.models.tasks import unwrap

if TYPE_CHECKING:
    from gradleak.attacks.optimization.ghost.statistics import GhostStatistics
    from gradleak.attacks.optimization.matching.distances import Distance


class CandidateScoring:
    """Batched candidate scoring for
    :class:`~gradleak.attacks.optimization.matching.objective.GradientMatcher`, which provides what
    is read here: its model, distance, targets, labels and masks, loss module, ghost statistics and
    captures, simulator and matched parameters."""

    ghost: GhostStatistics | None
    distance: Distance

    def _ghost_losses(
        self, embeds: torch.Tensor, ids: torch.Tensor | None, create_graph: bool
    ) -> torch.Tensor:
        """Distance of each candidate ``embeds[c]`` (``[C, B, L, d]``) by the ghost path: the
        candidates run as one batch of ``C * B`` rows, each keeping its own statistics."""
        loss_of, rows, count = self._stacked_loss(embeds, ids)
        inner, norm = self.ghost.statistics(loss_of, rows, count, create_graph)
        return self.distance.from_statistics(inner, norm, self.ghost.target_norms)

    def _streamed_losses(self, embeds: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        """Distance of each candidate ``embeds[c]`` (``[C, B, L, d]``) for squared L2 plus L1
        (LAMP_L2+L1), not differentiable: the candidates run as one batch as on the ghost
        path, and each one's ``G - T`` is formed a block at a time from the captures
        (:mod:`gradleak.attacks.optimization.ghost.streamed`) instead of a materialized gradient per
        candidate."""
        loss_of, rows, count = self._stacked_loss(embeds, ids)
        distance = self.distance
        return self.captures.streamed_l2_l1(
            loss_of, rows, count, distance.entrywise_l1, distance.grouped, create_graph=False
        )

    def _stacked_loss(
        self, embeds: torch.Tensor, ids: torch.Tensor | None
    ) -> tuple[Callable[[], torch.Tensor], int, int]:
        """The mean loss of candidates ``embeds`` (``[C, B, L, d]``) run as one batch, its
        rows (``C * B``) and groups (``C``)."""
        count, batch = embeds.shape[:2]
        flat = embeds.reshape(count * batch, *embeds.shape[2:])
        flat_ids = None if ids is None else ids.reshape(count * batch, *ids.shape[2:])
        rows = torch.arange(batch, device=self.attention_mask.device).repeat(count)
        return self.loss_of_rows(flat, rows, flat_ids), count * batch, count

    def loss_of_rows(
        self, embeds: torch.Tensor, rows: torch.Tensor | list[int], ids: torch.Tensor | None = None
    ) -> Callable[[], torch.Tensor]:
        """The mean loss of ``embeds`` (``[n, L, d]``) whose row ``i`` stands for the batch's
        row ``rows[i]``: that row's labels, attention mask and token types. A candidate stack
        repeats the batch's rows; a candidate for one sentence repeats that sentence's row."""
        labels = {key: value[rows] for key, value in (self.labels or {}).items()}
        mask = self.attention_mask[rows]
        types = None if self.token_type_ids is None else self.token_type_ids[rows]
        return lambda: self._loss_module(embeds, labels, ids, mask, types)

    @property
    def streams_candidates(self) -> bool:
        """Whether candidates are scored by :meth:`_streamed_losses`: a distance with an
        entrywise L1 term (no statistics form) and captures that follow the model."""
        return self.ghost is None and (
            self.distance.entrywise_l1 is not None and self.captures is not None
        )

    def batched_loss(
        self,
        embeds: torch.Tensor,
        ids: torch.Tensor | None = None,
        chunk: int = 0,
    ) -> torch.Tensor:
        """Matching loss of each candidate ``embeds[c]`` (``[C, B, L, d]``), not differentiable.

        The same number as :meth:`loss` per candidate, computed ``chunk`` candidates at a time:
        on the ghost path as one stacked batch (no per-candidate gradient is formed), for
        squared L2 plus L1 as one stacked batch streamed from its captures, otherwise with
        ``vmap`` over ``torch.func.grad``, where all candidates of a chunk share one dropout
        mask in train mode. ``chunk=0`` loops one by one with each candidate's gradient
        materialized (the reference's way, and the fallback for a model torch.func cannot
        trace). On the stacked paths a train-mode attacker draws each row's dropout mask
        apart, as the one-by-one loop does.
        """
        if chunk > 0 and (self.ghost is not None or self.streams_candidates):
            return self._stacked_losses(embeds, ids, chunk)
        if chunk <= 0:
            return self._looped_losses(embeds, ids)
        return self._vmapped_losses(embeds, ids, chunk)

    def _stacked_losses(
        self, embeds: torch.Tensor, ids: torch.Tensor | None, chunk: int
    ) -> torch.Tensor:
        """:meth:`batched_loss` as one stacked batch per ``chunk`` candidates: by the ghost
        statistics, or streamed (:meth:`_streamed_losses`)."""
        parts = []
        with torch.enable_grad():
            for start in range(0, embeds.shape[0], chunk):
                part = embeds[start : start + chunk]
                part_ids = None if ids is None else ids[start : start + chunk]
                if self.ghost is not None:
                    losses = self._ghost_losses(part, part_ids, create_graph=False)
                else:
                    losses = self._streamed_losses(part, part_ids)
                parts.append(losses.detach())
        return torch.cat(parts)

    def _looped_losses(self, embeds: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        """:meth:`batched_loss` one candidate at a time, each gradient materialized."""
        with torch.enable_grad():
            losses = [
                self.distance(
                    self.dummy_gradients(embeds[c], None if ids is None else ids[c], False),
                    self.targets,
                ).detach()
                for c in range(embeds.shape[0])
            ]
        return torch.stack(losses)

    def _vmapped_losses(
        self, embeds: torch.Tensor, ids: torch.Tensor | None, chunk: int
    ) -> torch.Tensor:
        """:meth:`batched_loss` by ``vmap`` over each candidate's gradient (or simulated round),
        ``chunk`` candidates at a time; a chunk shares one dropout mask in train mode."""
        params = {name: p.detach() for name, p in zip(self.param_names, self.params, strict=True)}
        labels = self.labels or {}
        module = self._loss_module
        simulator = self.simulator

        rows = None  # the current chunk's table rows, set below (read when ``one`` runs)

        def one(candidate: torch.Tensor, candidate_ids: torch.Tensor | None) -> torch.Tensor:
            if simulator is not None:
                by_name = simulator.pseudo_gradient(
                    candidate, labels, candidate_ids, rows, self._names
                )
            else:
                by_name = grad(module.with_parameters)(params, candidate, labels, candidate_ids)
            return self.distance([s.take(by_name[s.param]) for s in self.specs], self.targets)

        batched = vmap(one, in_dims=(0, None if ids is None else 0), randomness="same")
        out = []
        with torch.no_grad():
            for start in range(0, embeds.shape[0], chunk):
                part = slice(start, start + chunk)
                part_ids = None if ids is None else ids[part]
                if simulator is not None:  # the rows of the whole chunk (unique is not vmapped)
                    rows = simulator.table_rows(part_ids)
                out.append(batched(embeds[part], part_ids))
        return torch.cat(out)

    def candidate_numel(self) -> int:
        """Entries one candidate's scoring keeps (sizes batched scoring): on the ghost and the
        streamed paths its activations (about 40 per token, hidden unit and layer), else the
        matched parameters' gradients or a simulated round's weights and optimizer state, per
        batch row."""
        if self.ghost is not None or self.streams_candidates:
            gm = self.knowledge.global_model
            layers = gm.adapter.num_layers(unwrap(self.model))
            hidden = gm.adapter.token_embedding(unwrap(self.model)).weight.shape[1]
            return 40 * self.attention_mask.numel() * hidden * layers
        rows = self.attention_mask.shape[0]
        if self.simulator is not None:
            return self.simulator.state_numel() * rows
        return sum(p.numel() for p in self.params) * rows
