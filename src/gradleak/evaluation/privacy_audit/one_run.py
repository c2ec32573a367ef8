"""The (epsilon, delta) lower bound of one training run (Steinke, Nasr & Jagielski 2023)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gradleak.errors import GradleakError
from gradleak.evaluation.privacy_audit.guesses import (
    Guesses,
    Scores,
    Tally,
    best_over_pairs,
    check_counts,
    checked_delta,
    largest_rejected,
    open_unit,
)


@dataclass(frozen=True)
class OneRunEpsilon(Tally):
    """The (epsilon, delta) lower bound of one run: the mechanism is not (epsilon', delta)-DP for
    any epsilon' below ``epsilon``, at ``confidence``; the guesses behind it as in
    :class:`Tally`."""

    epsilon: float
    delta: float
    confidence: float


# --- Steinke, Nasr & Jagielski ---------------------------------------------------------------


def one_run_p_value(
    canaries: int, guesses: int, correct: int, epsilon: float, delta: float
) -> float:
    """The probability, under (epsilon, delta)-DP, of at least ``correct`` right guesses out of
    ``guesses`` among ``canaries`` Poisson canaries: Steinke et al.'s Theorem 5.2 in the form of
    their Corollary 5.4 (the p-value of their Appendix D code),

        p = f(v) + 2 m delta max_{i=1..v} (f(v - i) - f(v)) / i,  f(t) = P[Binomial(r, q) >= t],

    with q = e^epsilon / (1 + e^epsilon), m canaries, r guesses, v correct, capped at 1. With
    delta = 0 it is the binomial tail alone: under epsilon-DP the number of right guesses is
    stochastically dominated by Binomial(r, q), the accuracy of randomized response."""
    import numpy as np
    from scipy.stats import binom

    check_counts(canaries, guesses, correct)
    delta = checked_delta(delta, allow_zero=True)
    if not math.isfinite(epsilon) or epsilon < 0:
        raise GradleakError(f"epsilon must be finite and non-negative, got {epsilon!r}")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(binom.sf(correct - 1, guesses, q))  # f(v) = P[B >= v]
    if delta == 0 or correct == 0:
        return min(tail, 1.0)
    steps = np.arange(1, correct + 1)
    between = np.cumsum(binom.pmf(correct - steps, guesses, q))  # P[v - i <= B < v]
    return min(tail + 2 * canaries * delta * float(np.max(between / steps)), 1.0)


def one_run_epsilon_from_counts(
    canaries: int, guesses: int, correct: int, *, delta: float, confidence: float = 0.95
) -> float:
    """The largest epsilon that ``correct`` right guesses out of ``guesses`` reject at
    ``confidence``: the largest epsilon whose :func:`one_run_p_value` is at most 1 - confidence
    (0 when not even epsilon = 0 is rejected), as the paper's Appendix D finds it by bisection.
    The p-value grows with epsilon, so every epsilon below is rejected too. ``delta`` may be 0
    here (pure DP)."""
    check_counts(canaries, guesses, correct)
    delta = checked_delta(delta, allow_zero=True)
    beta = 1 - open_unit(confidence, "confidence")
    return _epsilon_search(canaries, guesses, correct, delta, beta, 0.0)


def _epsilon_search(m: int, r: int, v: int, delta: float, beta: float, floor: float) -> float:
    """The largest epsilon >= floor with p-value <= beta, or floor if there is none."""
    return largest_rejected(
        lambda eps: one_run_p_value(m, r, v, eps, delta) <= beta, floor, v, r, "epsilon"
    )


def one_run_epsilon(
    in_scores: Scores,
    out_scores: Scores,
    *,
    delta: float = 1e-5,
    confidence: float = 0.95,
    guesses: Guesses | None = None,
) -> OneRunEpsilon:
    """The one-run (epsilon, delta) lower bound of Steinke, Nasr & Jagielski (their Algorithm 1
    auditor and Theorem 5.2) from the canaries' scores.

    Each (k+, k-) pair of ``guesses`` (default :func:`guess_grid`) guesses the top k+ scores
    "in" and the bottom k- "out" and is tested at (1 - confidence) / pairs; the result is the
    pair whose bound is largest. Assumes Poisson inclusion with probability 1/2 and guesses
    that depend on the run's output only (see the module's docstring)."""
    delta = checked_delta(delta)
    bound, tally = best_over_pairs(
        in_scores,
        out_scores,
        guesses,
        confidence,
        lambda m, r, v, share, floor: _epsilon_search(m, r, v, delta, share, floor),
    )
    return OneRunEpsilon(epsilon=bound, delta=delta, confidence=confidence, **vars(tally))
