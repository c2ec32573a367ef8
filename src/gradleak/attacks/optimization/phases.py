"""The two phases of an optimization attack around its continuous steps: the start (one
Gaussian draw, or LAMP's search over 500 draws and 500 orders) and LAMP's discrete rounds
(reorderings of each sentence scored by matching loss plus the LM prior)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from gradleak.attacks.optimization import initialization as init
from gradleak.attacks.optimization.discrete.moves import candidate_permutations, transform_of
from gradleak.attacks.optimization.discrete.prior import LanguagePrior
from gradleak.attacks.optimization.settings import OptimizationSettings
from gradleak.attacks.optimization.workspace import DummyBatch, Workspace
from gradleak.runtime import devices


def start_embeddings(
    s: OptimizationSettings,
    ws: Workspace,
    assignments: list[dict[str, torch.Tensor] | None],
    generator: torch.Generator,
    info: dict[str, Any],
) -> torch.Tensor:
    """The starting free embeddings (and, with unknown labels, the labels to use)."""
    batch, length = ws.template.shape
    shape = (batch, length, ws.embedding.shape[1])
    if s.rescale_init or s.alpha_reg > 0:
        size = s.init_size or init.mean_embedding_norm(ws.embedding, ws.allowed)
        info["init_size"] = size
    if s.n_init == 1 and len(assignments) == 1:
        # DLG/TAG: one draw, no scoring
        free = devices.randn(*shape, generator=generator, device=ws.embedding.device)
    else:
        group = ws.group

        def scorer(labels):
            def score(candidates: torch.Tensor) -> torch.Tensor:
                ws.matcher.labels = labels
                return ws.score(candidates)

            return score

        start = init.best_gaussian(
            s.n_init,
            shape,
            [scorer(a) for a in assignments],
            generator,
            group,
            ws.embedding.device,
        )
        ws.matcher.labels = assignments[start.assignment]
        if s.n_init > 1:
            start = init.best_permutation(
                start, ws.free_positions, s.n_init, ws.score, generator, group
            )
        info["init_loss"] = start.loss
        info["init_permutations_accepted"] = start.accepted_permutations
        if len(assignments) > 1:
            info["labels"] = assignments[start.assignment]["label"].tolist()
        free = start.free
    if s.rescale_init:
        free = init.rescale(free, info["init_size"])
    return free


def discrete_round(
    s: OptimizationSettings,
    ws: Workspace,
    dummy: DummyBatch,
    prior: LanguagePrior | None,
    generator: torch.Generator,
    accepted: Counter[str],
) -> None:
    """For each sentence in turn, try reorderings of its free embeddings and keep the one
    with the lowest matching loss plus ``alpha_lm`` x prior cross-entropy of its tokens
    (the prior's mean is over the whole batch's tokens, as the batch is what is scored)."""
    with torch.no_grad():
        free = dummy.free.detach()  # shares storage: accepted moves update the iterate
        batch, length = ws.template.shape
        ids = ws.ids(free)
        if prior is not None:
            contents = [ids[b, ws.free_positions[b]].tolist() for b in range(batch)]
            sums, counts = prior.sentence_nll(contents)
        for b in range(batch):
            slots = ws.free_positions[b]
            if len(slots) < 2:
                continue
            perms = candidate_permutations(slots.tolist(), length, s.candidates, generator)
            perms = perms.to(free.device)  # drawn on the CPU: one draw on every device
            unique, inverse = torch.unique(perms, dim=0, return_inverse=True)
            rows = free[b][unique]  # [U, L, d]: sentence b reordered, one per unique order
            score = ws.row_scorer(free, b)
            if prior is None:
                totals = score(rows).double()
            else:
                cand_sums, cand_counts = prior.sentence_nll(ids[b][unique][:, slots].tolist())
                other_sum, other_count = sums.sum() - sums[b], counts.sum() - counts[b]
                lm = (cand_sums + other_sum) / (cand_counts + other_count).clamp(min=1)
                totals = scores_that_can_win(
                    score, rows, s.alpha_lm * lm, int(inverse[0]), ws.group
                )
            per_candidate = torch.nan_to_num(totals, nan=float("inf"))[inverse]
            k = int(per_candidate.argmin())  # ties keep the first: the identity
            u = int(inverse[k])
            if torch.equal(unique[u], perms[0]):
                continue
            free[b] = free[b][unique[u]]
            ids[b] = ids[b][unique[u]]
            if prior is not None:
                sums[b], counts[b] = cand_sums[u], cand_counts[u]
            accepted[transform_of(k)] += 1


def scores_that_can_win(
    score: Callable[[torch.Tensor], torch.Tensor],
    candidates: torch.Tensor,
    prior_terms: torch.Tensor,
    current: int,
    group: int,
) -> torch.Tensor:
    """Each candidate's matching loss (``score`` of its rows) plus its prior term, where it
    can still be the lowest; ``inf`` where it cannot (``[C]``, float64).

    The matching loss is a distance, never negative, so a candidate whose prior term alone
    exceeds the lowest total found so far cannot win, and its matching loss (a forward and
    backward pass of the victim) is not computed. Candidates are scored ``group`` at a time in
    ascending order of prior term, the ``current`` order first, so the bound tightens early.
    The lowest total and its candidate are those of scoring every candidate, LAMP's rule: every
    candidate left out scores above it. The prior terms spread far wider than the matching
    losses, so most candidates are left out (docs/design/optimization-speed.md).
    """
    order = [current] + [
        c for c in torch.argsort(prior_terms, stable=True).tolist() if c != current
    ]
    totals = torch.full_like(prior_terms, float("inf"))
    lowest = float("inf")
    terms = prior_terms.tolist()
    for start in range(0, len(order), group):
        chosen = [c for c in order[start : start + group] if terms[c] <= lowest]
        if not chosen:  # the rest come in ascending order: none can win
            break
        matching = score(candidates[chosen]).double()
        total = torch.nan_to_num(matching + prior_terms[chosen], nan=float("inf"))
        totals[chosen] = total
        lowest = min(lowest, float(total.min()))
    return totals
