"""Which of an encoder search's sentences make the batch: the exact ones, then the nearest
approximate ones that add something and fit the batch's token count."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradleak.attacks.dager.descent import log_mean
from gradleak.attacks.dager.lengths import LengthBudget
from gradleak.attacks.dager.search import SearchState, pick_batch, threshold
from gradleak.attacks.dager.settings import DagerSettings


@dataclass
class Candidate:
    """A complete encoder sentence and the layer-2 distance of each of its positions."""

    ids: list[int]
    distances: torch.Tensor  # [L], float64

    @property
    def worst(self) -> float:
        """Its largest distance: a sentence of the batch passes at every position."""
        return float(self.distances.max())

    @property
    def mean_log(self) -> float:
        """How close it came overall, for ranking sentences that do not pass."""
        return float(log_mean(self.distances))


def pick_sentences(
    found: list[Candidate],
    batch_size: int,
    settings: DagerSettings,
    state: SearchState,
    floor: float = 0.0,
    tokens: int | None = None,
) -> list[tuple[list[int], float | None]]:
    """The batch: every sentence that passes layer 2 exactly, then the best approximate
    ones that are not variants of a sentence already chosen and, where the batch's token
    count is known (``tokens``), whose lengths leave room for a complete batch.

    Starts that miss end on near variants of a sentence (one token off); they score well
    but only repeat what was chosen, while the batch has other sentences to cover. Under
    dropout nothing passes and the distances only rank: two short wrong sentences can
    outrank the long right ones, and the token count rules such a choice out. ``floor``:
    the exact cut's lowest value (the inputs' drift over several local steps).
    """
    if not found:
        state.notes.append("no sentence was found")
        return pick_batch([], batch_size)
    worst = torch.stack([c.distances.max() for c in found])
    cut = threshold(
        worst,
        settings.l2_threshold,
        batch_size,
        settings.fallback_threshold,
        floor=floor,
    )
    exact = sorted((c for c in found if c.worst < cut), key=lambda c: c.worst)
    rest = sorted((c for c in found if c.worst >= cut), key=lambda c: c.mean_log)
    chosen: list[Candidate] = []
    for candidate in exact:
        if candidate.ids not in [c.ids for c in chosen]:
            chosen.append(candidate)
    state.notes.append(f"{len(chosen)} sentences pass layer 2")
    budget = (
        None if tokens is None else LengthBudget.of([len(c.ids) for c in found], batch_size, tokens)
    )

    def fits(candidate: Candidate) -> bool:
        lengths = [len(c.ids) for c in chosen]
        return budget is None or budget.room_for(len(candidate.ids), lengths)

    for candidate in rest:
        if (
            len(chosen) < batch_size
            and fits(candidate)
            and not any(_variant(candidate.ids[1:-1], c.ids[1:-1]) for c in chosen)
        ):
            chosen.append(candidate)
    # Fewer distinct sentences than the batch holds: variants are still better than none.
    for candidate in rest:
        if len(chosen) < batch_size and candidate.ids not in [c.ids for c in chosen]:
            chosen.append(candidate)
    return pick_batch([(c.ids, c.worst) for c in chosen], batch_size)


def _variant(ids: list[int], other: list[int], share: float = 0.5) -> bool:
    """Whether ``ids`` repeats at least ``share`` of its tokens from ``other`` (as a multiset,
    so a shifted or shortened copy counts too)."""
    remaining = list(other)
    common = 0
    for token in ids:
        if token in remaining:
            remaining.remove(token)
            common += 1
    return common >= share * len(ids)
