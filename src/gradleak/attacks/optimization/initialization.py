"""Where the optimization starts: one Gaussian draw (DLG/TAG) or LAMP's two-step search.

LAMP draws ``n`` Gaussian candidates and keeps the one with the lowest matching loss, then tries
``n`` random orders of that candidate's free positions and keeps the best, and finally rescales
every free vector to the typical norm of a token embedding (so the start lies where real
embeddings live). Candidates are scored in batches, not one by one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gradleak.attacks.base import AttackFailed
from gradleak.runtime import devices

Score = Callable[[torch.Tensor], torch.Tensor]  # [C, B, L, d] free embeddings -> [C] losses


@dataclass
class InitResult:
    """The chosen start, its matching loss and the label assignment it was scored with."""

    free: torch.Tensor  # [B, L, d]
    loss: float
    assignment: int  # index into the assignments that were tried
    accepted_permutations: int = 0


def mean_embedding_norm(embedding: torch.Tensor, allowed: torch.Tensor) -> float:
    """Mean L2 norm of the allowed token embeddings (LAMP's 1.4 is BERT-base's value)."""
    return float(embedding[allowed].norm(dim=-1).mean())


def gaussian_candidates(
    count: int,
    shape: tuple[int, int, int],
    generator: torch.Generator,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``count`` standard-normal candidates on ``device``, drawn one after the other so the
    draws do not depend on how candidates are grouped for scoring (the first equals DLG/TAG's
    start) nor on the device."""
    draws = [devices.randn(*shape, generator=generator) for _ in range(count)]
    return torch.stack(draws).to(device)


def best_gaussian(
    n: int,
    shape: tuple[int, int, int],
    score_with: Sequence[Score],
    generator: torch.Generator,
    group: int,
    device: torch.device | str = "cpu",
) -> InitResult:
    """The lowest-loss candidate among ``n`` Gaussian draws, over every scoring function
    (one per label assignment when labels are unknown: the pair with the lowest loss wins)."""
    best: InitResult | None = None
    for start in range(0, n, group):
        candidates = gaussian_candidates(min(group, n - start), shape, generator, device)
        for index, score in enumerate(score_with):
            losses = torch.nan_to_num(score(candidates), nan=float("inf"))
            k = int(losses.argmin())
            if best is None or losses[k] < best.loss:
                best = InitResult(candidates[k].clone(), float(losses[k]), index)
    if best is None or not math.isfinite(best.loss):
        raise AttackFailed("every initial candidate gave a non-finite matching loss")
    return best


def random_free_permutations(
    free_positions: Sequence[torch.Tensor], length: int, n: int, generator: torch.Generator
) -> torch.Tensor:
    """``[n, B, L]`` position permutations: each sentence's free positions shuffled at random,
    every other position (specials, padding) left in place. Drawn on the CPU, placed where the
    positions are."""
    device = free_positions[0].device
    perms = torch.arange(length, device=device).repeat(n, len(free_positions), 1)
    for k in range(n):
        for row, slots in enumerate(free_positions):
            order = devices.randperm(len(slots), generator=generator, device=device)
            perms[k, row, slots] = slots[order]
    return perms


def permute_rows(free: torch.Tensor, perms: torch.Tensor) -> torch.Tensor:
    """``free`` (``[B, L, d]``) reordered by each of ``perms`` (``[n, B, L]``): ``[n, B, L, d]``."""
    rows = torch.arange(free.shape[0], device=free.device)[None, :, None]
    return free[rows, perms]


def best_permutation(
    start: InitResult,
    free_positions: Sequence[torch.Tensor],
    n: int,
    score: Score,
    generator: torch.Generator,
    group: int,
) -> InitResult:
    """LAMP's second step: keep the best of ``n`` random orders of the start (if better)."""
    best = start
    length = start.free.shape[1]
    for begin in range(0, n, group):
        perms = random_free_permutations(free_positions, length, min(group, n - begin), generator)
        candidates = permute_rows(best.free, perms)
        losses = torch.nan_to_num(score(candidates), nan=float("inf"))
        k = int(losses.argmin())
        if losses[k] < best.loss:  # strictly better, as the reference
            accepted = best.accepted_permutations + 1
            best = InitResult(candidates[k].clone(), float(losses[k]), best.assignment, accepted)
    return best


def rescale(free: torch.Tensor, norm: float) -> torch.Tensor:
    """Every vector scaled to length ``norm``."""
    return free / free.norm(dim=-1, keepdim=True).clamp(min=1e-12) * norm
