"""Scoring candidates that change one row of a batch, the batch's other rows run once.

LAMP's discrete round reorders one sentence of the batch at a time, and every candidate is the
whole batch with that sentence reordered: at B sentences each candidate costs B rows of the
victim's forward and backward pass, B - 1 of them the same in every candidate. Where the rows
do not interact (an eval-mode model, a loss that is the mean over rows: classification and
question answering), the batch's gradient is the sum of its rows' shares, so the other rows
are run once per sentence (:meth:`GhostStatistics.shared_rows`) and each candidate runs only
its own row; the ghost statistics are then formed over the candidate's tokens and the shared
ones together, which is the whole batch's gradient up to summation order. At B = 4 a round
runs about a quarter of the rows it did.

Whether this holds for a matcher is checked once, on a probe input, against scoring the whole
batch (:meth:`RowScoring.rows_apart_on`); where it does not, the caller scores whole batches.
:class:`RowScoring` is a part of
:class:`~gradleak.attacks.optimization.matching.objective.GradientMatcher`, as
:class:`~gradleak.attacks.optimization.matching.candidate_scoring.CandidateScoring` is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from gradleak.attacks.optimization.ghost.statistics import SharedRows

if TYPE_CHECKING:
    from gradleak.attacks.optimization.ghost.statistics import GhostStatistics
    from gradleak.attacks.optimization.matching.distances import Distance

# Tasks whose loss is the mean of one term per row (a row's share of the batch is 1 / B).
_ROW_MEAN_TASKS = ("classification", "qa")


class RowScoring:
    """Row-by-row candidate scoring for
    :class:`~gradleak.attacks.optimization.matching.objective.GradientMatcher`, which provides
    what is read here: its ghost statistics, distance, knowledge, labels, model and
    ``loss_of_rows`` / ``batched_loss``."""

    ghost: GhostStatistics | None
    distance: Distance
    knowledge: Any
    labels: Any
    model: torch.nn.Module
    needs_ids: bool

    def shared_rows(self, embeds: torch.Tensor, row: int) -> SharedRows:
        """Every row of the batch ``embeds`` (``[B, L, d]``) but ``row``, run once: what each
        candidate for ``row`` shares."""
        batch = embeds.shape[0]
        others = [r for r in range(batch) if r != row]
        loss_of = self.loss_of_rows(embeds[others], others)
        with torch.enable_grad():
            return self.ghost.shared_rows(loss_of, len(others), len(others) / batch)

    def losses_beside(
        self, shared: SharedRows, row: int, candidates: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        """Matching loss of the batch with row ``row`` replaced by each of ``candidates``
        (``[C, L, d]`` embeddings), the other rows ``shared``: ``[C]``, ``chunk`` at a time."""
        out = []
        with torch.enable_grad():
            for start in range(0, candidates.shape[0], chunk):
                part = candidates[start : start + chunk]
                loss_of = self.loss_of_rows(part, [row] * part.shape[0])
                inner, norm = self.ghost.statistics(
                    loss_of, part.shape[0], part.shape[0], create_graph=False, beside=shared
                )
                distance = self.distance.from_statistics(inner, norm, self.ghost.target_norms)
                out.append(distance.detach())
        return torch.cat(out)

    def rows_apart_on(self, probe: torch.Tensor) -> bool:
        """Whether candidates for one row may be scored beside the others run once: the ghost
        path, more than one row, known labels, no token ids read, an eval-mode model (a
        train-mode one draws dropout masks per candidate row) and a loss that is a mean over
        rows; then checked on ``probe`` (``[B, L, d]``): each row scored beside the others must
        give the whole batch's loss."""
        gm = self.knowledge.global_model
        if self.ghost is None or probe.shape[0] < 2 or self.labels is None:
            return False
        if self.needs_ids or self.model.training or gm.task not in _ROW_MEAN_TASKS:
            return False
        with torch.no_grad():
            whole = self.batched_loss(probe[None], chunk=1)
            apart = torch.cat(
                [
                    self.losses_beside(self.shared_rows(probe, row), row, probe[row][None], 1)
                    for row in range(probe.shape[0])
                ]
            )
        return bool(torch.allclose(apart, whole.expand_as(apart), rtol=1e-4, atol=1e-7))
