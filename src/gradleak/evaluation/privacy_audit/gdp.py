"""The Gaussian-DP lower bound of one run (Mahloujifar, Melis & Chaudhuri 2025), and mu-GDP
against (epsilon, delta)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gradleak.errors import GradleakError
from gradleak.evaluation.privacy_audit.guesses import (
    INV_PHI,
    SQRT2,
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
class OneRunGdp(Tally):
    """The Gaussian-DP lower bound of one run: the mechanism is not mu'-GDP for any mu' below
    ``mu``, at ``confidence``. ``epsilon`` is the epsilon at ``delta`` of a mu-GDP mechanism
    (:func:`gdp_epsilon`): a lower bound on the mechanism's epsilon at delta if its trade-off
    curve is Gaussian (the paper's hypothesized f), not otherwise. The guesses behind it as in
    :class:`Tally`."""

    mu: float
    epsilon: float
    delta: float
    confidence: float


# --- Gaussian DP: Mahloujifar, Melis & Chaudhuri ---------------------------------------------


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / SQRT2)


def _blow_up_inverse(x: float, mu: float) -> float:
    """Phi(Phi^-1(x) - mu): the least probability an event can have without the canary when it
    has probability x with it, under mu-GDP (the inverse of the blow-up 1 - f_mu, where
    f_mu(a) = Phi(Phi^-1(1 - a) - mu) is the Gaussian trade-off function)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    return _phi(INV_PHI(x) - mu)


def gdp_rejects(canaries: int, guesses: int, correct: int, mu: float, significance: float) -> bool:
    """Whether ``correct`` right guesses out of ``guesses`` among ``canaries`` Poisson canaries
    reject mu-GDP at level ``significance``: the recursion of Mahloujifar et al. for a guessing
    game with abstentions (``audit_rh_with_cap`` in the authors' code), with
    f the Gaussian trade-off function.

    Suppose at least v of the r guesses were right with probability tau (= significance). Let
    r_i and h_i be the right and the wrong guesses' probability mass per canary on the event
    "at least i right". Then r_v >= tau v / m and h_v >= tau (r - v) / m; f-DP forces
    h_i >= Phi(Phi^-1(r_{i+1}) - mu), and the outcomes with exactly i right add i right guesses
    for every r - i wrong ones: r_i = r_{i+1} + i / (r - i) (h_i - h_{i+1}). At i = 0 the event
    is certain and r_0 + h_0 = r / m; a larger value contradicts mu-GDP, which is rejected."""
    check_counts(canaries, guesses, correct)
    if not math.isfinite(mu) or mu < 0:
        raise GradleakError(f"mu must be finite and non-negative, got {mu!r}")
    tau = open_unit(significance, "significance")
    right = tau * correct / canaries
    wrong = tau * (guesses - correct) / canaries
    for i in range(correct - 1, -1, -1):
        forced = max(wrong, _blow_up_inverse(right, mu))
        if forced == wrong:  # nothing moves from here on
            break
        right = min(right + i / (guesses - i) * (forced - wrong), 1.0)
        wrong = forced
    return right + wrong > guesses / canaries


def one_run_gdp_mu_from_counts(
    canaries: int, guesses: int, correct: int, *, confidence: float = 0.95
) -> float:
    """The largest mu that :func:`gdp_rejects` rejects at ``confidence`` (0 if none): a mu-GDP
    mechanism is mu'-GDP for every mu' > mu, so the rejected mu form an interval from 0."""
    check_counts(canaries, guesses, correct)
    beta = 1 - open_unit(confidence, "confidence")
    return _mu_search(canaries, guesses, correct, beta, 0.0)


def _mu_search(m: int, r: int, v: int, tau: float, floor: float) -> float:
    """The largest mu >= floor that the counts reject, or floor if they reject none."""
    return largest_rejected(lambda mu: gdp_rejects(m, r, v, mu, tau), floor, v, r, "Gaussian-DP")


def one_run_gdp(
    in_scores: Scores,
    out_scores: Scores,
    *,
    delta: float = 1e-5,
    confidence: float = 0.95,
    guesses: Guesses | None = None,
) -> OneRunGdp:
    """The one-run Gaussian-DP lower bound of Mahloujifar, Melis & Chaudhuri from the canaries'
    scores, and the epsilon at ``delta`` it implies (:func:`gdp_epsilon`).

    The guesses and the split of the confidence are as in :func:`one_run_epsilon`, and so are
    the assumptions; the epsilon also assumes a Gaussian trade-off curve (see
    :class:`OneRunGdp`)."""
    delta = checked_delta(delta)
    mu, tally = best_over_pairs(in_scores, out_scores, guesses, confidence, _mu_search)
    return OneRunGdp(
        mu=mu, epsilon=gdp_epsilon(mu, delta), delta=delta, confidence=confidence, **vars(tally)
    )


# --- mu-GDP and (epsilon, delta) -------------------------------------------------------------


def gdp_delta(mu: float, epsilon: float) -> float:
    """The delta at ``epsilon`` of a mu-GDP mechanism (Dong, Roth & Su, "Gaussian differential
    privacy", Corollary 2.13; the Gaussian mechanism's exact profile, Balle & Wang 2018,
    Theorem 8): delta = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2)."""
    from scipy.special import log_ndtr

    if not math.isfinite(mu) or mu < 0:
        raise GradleakError(f"mu must be finite and non-negative, got {mu!r}")
    if not math.isfinite(epsilon) or epsilon < 0:
        raise GradleakError(f"epsilon must be finite and non-negative, got {epsilon!r}")
    if mu == 0:
        return 0.0
    first = float(log_ndtr(-epsilon / mu + mu / 2))
    second = epsilon + float(log_ndtr(-epsilon / mu - mu / 2))
    if second >= first:
        return 0.0
    return math.exp(first) * -math.expm1(second - first)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The epsilon at ``delta`` of a mu-GDP mechanism: the root of :func:`gdp_delta` (delta
    falls as epsilon grows); 0 when mu-GDP already gives (0, delta)-DP."""
    from scipy.optimize import brentq

    delta = checked_delta(delta)
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    high = max(1.0, mu * mu)
    while gdp_delta(mu, high) > delta:
        high *= 2
    return float(brentq(lambda eps: gdp_delta(mu, eps) - delta, 0.0, high, xtol=1e-10))


def gdp_mu(epsilon: float, delta: float) -> float:
    """The mu of the Gaussian mechanism that is exactly (epsilon, delta)-DP: the inverse of
    :func:`gdp_epsilon` (delta grows with mu at a fixed epsilon)."""
    from scipy.optimize import brentq

    delta = checked_delta(delta)
    if not math.isfinite(epsilon) or epsilon < 0:
        raise GradleakError(f"epsilon must be finite and non-negative, got {epsilon!r}")
    high = 1.0
    while gdp_delta(high, epsilon) < delta:
        high *= 2
    return float(brentq(lambda mu: gdp_delta(mu, epsilon) - delta, 0.0, high, xtol=1e-12))
