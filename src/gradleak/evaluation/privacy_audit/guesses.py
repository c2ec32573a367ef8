"""The canaries' scores checked, and the guesses an auditor makes from them: the top k+ scores
guessed "in", the bottom k- "out", ties broken against the auditor (see the package's
docstring)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, TypeAlias

from gradleak.errors import GradleakError

if TYPE_CHECKING:
    import numpy as np

Scores: TypeAlias = "Sequence[float] | np.ndarray"  # one score per canary, higher = "in"
Guesses: TypeAlias = Sequence[tuple[int, int]]  # (k_plus, k_minus) pairs

MIN_GUESSES = 10  # the smallest number of guesses in the default grid
FAVOURED = 16  # the default grid's favoured pair guesses m/16 "in" and m/16 "out"
INV_PHI = NormalDist().inv_cdf
SQRT2 = math.sqrt(2.0)
EPS_TOL = 1e-6  # bisection tolerance of epsilon and mu


# --- checks ----------------------------------------------------------------------------------


def checked_scores(values: Scores, name: str) -> np.ndarray:
    import numpy as np

    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise GradleakError(f"{name} must be a sequence of numbers") from None
    if array.ndim != 1:
        raise GradleakError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        raise GradleakError(f"{name} is empty: the audit needs at least one canary of each kind")
    if not np.all(np.isfinite(array)):
        raise GradleakError(f"{name} has a score that is not finite (nan or inf)")
    return array


def open_unit(value: float, name: str) -> float:
    if not isinstance(value, int | float) or not 0 < value < 1:
        raise GradleakError(f"{name} must be in (0, 1), got {value!r}")
    return float(value)


def checked_delta(value: float, allow_zero: bool = False) -> float:
    if allow_zero and value == 0:
        return 0.0
    return open_unit(value, "delta")


def is_int(value: object) -> bool:
    import numpy as np

    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_counts(canaries: int, guesses: int, correct: int) -> None:
    for name, value in (("canaries", canaries), ("guesses", guesses), ("correct", correct)):
        if not is_int(value):
            raise GradleakError(f"{name} must be an integer, got {value!r}")
    if not 0 <= correct <= guesses <= canaries or canaries < 1:
        raise GradleakError(
            f"need 0 <= correct <= guesses <= canaries and canaries >= 1, got correct={correct}, "
            f"guesses={guesses}, canaries={canaries}"
        )


# --- the guesses -----------------------------------------------------------------------------


def guess_grid(canaries: int) -> tuple[tuple[int, int], ...]:
    """The default (k+, k-) pairs for ``canaries`` canaries: first the favoured pair, m/16
    guesses "in" and m/16 "out" (where m >= 16), then for r = m, m/2, m/4, ... down to
    :data:`MIN_GUESSES`, r guesses split evenly between "in" and "out", and, for r <= m/2, r
    guesses all "in" (the one-sided auditor, for attacks whose low scores say little)."""
    if canaries < 1:
        raise GradleakError(f"canaries must be at least 1, got {canaries}")
    sizes = []
    size = canaries
    while size >= min(MIN_GUESSES, canaries) and size > 0:
        sizes.append(size)
        size //= 2
    favoured = [(canaries // FAVOURED, canaries // FAVOURED)] if canaries >= FAVOURED else []
    pairs = favoured + [(r - r // 2, r // 2) for r in sizes]
    pairs += [(r, 0) for r in sizes if r <= canaries // 2]
    return tuple(dict.fromkeys(pairs))


def grid_shares(canaries: int, pairs: int) -> list[float]:
    """Each default pair's part of the significance: half for the favoured pair (the first,
    where ``canaries`` >= 16), the other half split evenly among the rest; even shares where
    there is no favoured pair. Bonferroni: the parts add up to one."""
    if canaries < FAVOURED or pairs < 2:
        return [1 / pairs] * pairs
    return [0.5] + [0.5 / (pairs - 1)] * (pairs - 1)


def ranked_labels(in_scores: np.ndarray, out_scores: np.ndarray) -> np.ndarray:
    """1 for inserted, 0 for held out, ordered by score from highest to lowest, held-out before
    inserted within a tie (ties broken against the auditor)."""
    import numpy as np

    scores = np.concatenate([in_scores, out_scores])
    labels = np.concatenate([np.ones(in_scores.size, int), np.zeros(out_scores.size, int)])
    return labels[np.lexsort((labels, -scores))]


def checked_guesses(guesses: Guesses | None, canaries: int) -> tuple[tuple[int, int], ...]:
    if guesses is None:
        return guess_grid(canaries)
    pairs = tuple(tuple(pair) for pair in guesses)
    if not pairs:
        raise GradleakError("guesses is empty: give at least one (k_plus, k_minus) pair")
    for pair in pairs:
        if len(pair) != 2 or not all(is_int(k) for k in pair):
            raise GradleakError(
                f"guesses must be (k_plus, k_minus) pairs of integers, got {pair!r}"
            )
        k_plus, k_minus = pair
        if k_plus < 0 or k_minus < 0 or k_plus + k_minus == 0 or k_plus + k_minus > canaries:
            raise GradleakError(
                f"guesses ({k_plus}, {k_minus}) must be non-negative, not both zero, and at most "
                f"the {canaries} canaries together"
            )
    return tuple((int(k_plus), int(k_minus)) for k_plus, k_minus in pairs)


def correct_guesses(in_scores: Scores, out_scores: Scores, k_plus: int, k_minus: int) -> int:
    """How many of the guesses are right when the top ``k_plus`` scores are guessed "in" and the
    bottom ``k_minus`` "out" (ties against the auditor, see the module's docstring)."""
    ins, outs = checked_scores(in_scores, "in_scores"), checked_scores(out_scores, "out_scores")
    (pair,) = checked_guesses([(k_plus, k_minus)], ins.size + outs.size)
    ranked = ranked_labels(ins, outs)
    return int(ranked[: pair[0]].sum() + (1 - ranked[ranked.size - pair[1] :]).sum())


def guess_tallies(ranked: np.ndarray, pairs: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """(guesses, correct) of each pair, from the ranked labels."""
    import numpy as np

    top_in = np.concatenate([[0], np.cumsum(ranked)])
    bottom_out = np.concatenate([[0], np.cumsum(1 - ranked[::-1])])
    return [
        (k_plus + k_minus, int(top_in[k_plus] + bottom_out[k_minus])) for k_plus, k_minus in pairs
    ]


def largest_rejected(
    rejected: Callable[[float], bool], floor: float, right: int, guesses: int, what: str
) -> float:
    """The largest value >= ``floor`` that ``rejected`` holds for (it holds for every value
    below one it holds for), by doubling then bisection; ``floor`` when it holds for none (or
    the guesses are no better than chance)."""
    if right * 2 <= guesses or not rejected(floor):
        return floor
    low, high = floor, max(1.0, 2 * floor)
    while rejected(high):
        low, high = high, 2 * high
        if high > 1e3:  # r right guesses never reject more than ~log(r): a bug, not a bound
            raise GradleakError(f"the one-run {what} search did not converge")
    while high - low > EPS_TOL:
        middle = (low + high) / 2
        low, high = (middle, high) if rejected(middle) else (low, middle)
    return low


@dataclass(frozen=True)
class Tally:
    """The guesses behind a one-run bound: ``guesses`` of the ``canaries`` made (``k_plus``
    "in", ``k_minus`` "out"), ``correct`` of them right; ``pairs`` is how many (k+, k-) pairs
    were tried (the confidence was split among them)."""

    canaries: int
    guesses: int
    correct: int
    k_plus: int
    k_minus: int
    pairs: int


def best_over_pairs(
    in_scores: Scores,
    out_scores: Scores,
    guesses: Guesses | None,
    confidence: float,
    bound: Callable[[int, int, int, float, float], float],
) -> tuple[float, Tally]:
    """``bound(canaries, guesses, correct, significance, floor)`` of each (k+, k-) pair of
    ``guesses``, each tested at its share of 1 - confidence (given pairs: even shares; the
    default :func:`guess_grid`: :func:`grid_shares`): the largest of them and the tally of the
    pair that gave it."""
    ins, outs = checked_scores(in_scores, "in_scores"), checked_scores(out_scores, "out_scores")
    beta = 1 - open_unit(confidence, "confidence")
    canaries = ins.size + outs.size
    pairs = checked_guesses(guesses, canaries)
    tallies = guess_tallies(ranked_labels(ins, outs), pairs)
    shares = grid_shares(canaries, len(pairs)) if guesses is None else [1 / len(pairs)] * len(pairs)
    best, chosen = 0.0, 0
    for index, (r, v) in enumerate(tallies):
        found = bound(canaries, r, v, beta * shares[index], best)
        if found > best:
            best, chosen = found, index
    r, v = tallies[chosen]
    return best, Tally(canaries, r, v, *pairs[chosen], len(pairs))
