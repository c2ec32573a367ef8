"""The one-run privacy auditors: hand-computed cases, the papers' worked numbers, values of an
independent reference implementation, and small seeded Monte Carlo checks of validity (a 95%
bound above the true epsilon in at most 5% of runs) and power on the Gaussian mechanism."""

import math
import statistics
import subprocess
import sys
from statistics import NormalDist

import numpy as np
import pytest
from scipy.stats import binom, mannwhitneyu

from gradleak.errors import GradleakError
from gradleak.evaluation.privacy_audit import (
    auroc,
    correct_guesses,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    gdp_rejects,
    grid_shares,
    guess_grid,
    membership_metrics,
    one_run_epsilon,
    one_run_epsilon_from_counts,
    one_run_gdp,
    one_run_gdp_mu_from_counts,
    one_run_p_value,
    tpr_at_fpr,
)

PHI = NormalDist()
MU_AT_EPS_8 = 1.6660305978457175  # the Gaussian mechanism's mu at (8, 1e-5)


def gaussian_run(mu: float, canaries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One run of the Gaussian mechanism: Poisson(1/2) canaries, score = mu * in + N(0, 1)."""
    generator = np.random.default_rng(seed)
    inserted = generator.random(canaries) < 0.5
    scores = mu * inserted + generator.standard_normal(canaries)
    return scores[inserted], scores[~inserted]


# --- hand-computed cases -------------------------------------------------------------------


def test_p_value_without_delta_is_the_binomial_tail() -> None:
    # 20 of 20 right under 1-DP: every guess right with probability q = e / (1 + e)
    q = math.e / (1 + math.e)
    assert one_run_p_value(100, 20, 20, 1.0, 0.0) == pytest.approx(q**20, rel=1e-12)
    # 15 of 20: P[Binomial(20, q) >= 15]
    assert one_run_p_value(100, 20, 15, 1.0, 0.0) == pytest.approx(binom.sf(14, 20, q))


def test_p_value_delta_term_by_hand() -> None:
    m, delta, q = 50, 1e-3, 1 / (1 + math.exp(-0.5))
    # one guess, right: f(1) = q; the max over i = 1 is P[B = 0] / 1 = 1 - q
    assert one_run_p_value(m, 1, 1, 0.5, delta) == pytest.approx(q + 2 * m * delta * (1 - q))
    # 2 of 3 right: f(2) = P[B >= 2]; i = 1 gives P[B = 1], i = 2 gives (P[B = 1] + P[B = 0]) / 2
    f2 = 3 * q**2 * (1 - q) + q**3
    p1, p0 = 3 * q * (1 - q) ** 2, (1 - q) ** 3
    alpha = max(p1, (p1 + p0) / 2)
    assert one_run_p_value(m, 3, 2, 0.5, delta) == pytest.approx(f2 + 2 * m * delta * alpha)


def test_all_guesses_right_gives_the_closed_form_bound() -> None:
    # r of r right, delta 0: q^r = beta at q = beta^(1/r), so epsilon = log(q / (1 - q))
    for r in (10, 100, 1000):
        q = 0.05 ** (1 / r)
        expected = math.log(q / (1 - q))
        found = one_run_epsilon_from_counts(r, r, r, delta=0.0, confidence=0.95)
        assert found == pytest.approx(expected, abs=2e-6)
        assert found <= expected  # the bisection keeps the rejected end
    # a small delta only lowers it
    assert one_run_epsilon_from_counts(100, 100, 100, delta=1e-5) < math.log(
        0.05 ** (1 / 100) / (1 - 0.05 ** (1 / 100))
    )


def test_two_right_guesses_at_mu_zero_have_probability_one_quarter() -> None:
    # Two canaries, both guessed and both right. With no leakage (mu = 0, epsilon = 0) that has
    # probability exactly 1/4: the tests reject at a level above 1/4 and not at 1/4.
    assert one_run_p_value(2, 2, 2, 0.0, 0.0) == pytest.approx(0.25)
    assert not gdp_rejects(2, 2, 2, 0.0, 0.25)
    assert gdp_rejects(2, 2, 2, 0.0, 0.26)


@pytest.mark.parametrize("mu", [0.0, 0.3, 1.0, 3.0])
@pytest.mark.parametrize("tau", [0.05, 0.3, 0.6])
def test_gdp_recursion_unrolled_by_hand(mu: float, tau: float) -> None:
    # m = r = v = 2: r_2 = tau, h_2 = 0; i = 1: h_1 = Phi(Phi^-1(r_2) - mu), r_1 = r_2 + h_1;
    # i = 0: h_0 = max(h_1, Phi(Phi^-1(r_1) - mu)), r_0 = r_1. Reject iff r_0 + h_0 > 1.
    def inverse(x: float) -> float:
        return 0.0 if x <= 0 else 1.0 if x >= 1 else PHI.cdf(PHI.inv_cdf(x) - mu)

    h1 = inverse(tau)
    r1 = min(tau + h1, 1.0)
    h0 = max(h1, inverse(r1))
    assert gdp_rejects(2, 2, 2, mu, tau) == (r1 + h0 > 1)


def test_no_signal_gives_zero() -> None:
    same = np.zeros(40)
    assert one_run_epsilon(same[:20], same[20:]).epsilon == 0.0
    result = one_run_gdp(same[:20], same[20:])
    assert (result.mu, result.epsilon) == (0.0, 0.0)
    # no better than chance: half the guesses right or fewer
    assert one_run_epsilon_from_counts(1000, 200, 100, delta=1e-5) == 0.0
    assert one_run_gdp_mu_from_counts(1000, 200, 100) == 0.0


def test_ties_are_broken_against_the_auditor() -> None:
    # all tied: the top guesses get the held-out canaries, the bottom ones the inserted
    assert correct_guesses([1.0, 1.0], [1.0, 1.0], 2, 2) == 0
    assert correct_guesses([1.0, 1.0], [1.0, 1.0], 1, 0) == 0
    # top two of [2 in, 1 in, 1 out, 0 out]: 2 (in) and, in the tie at 1, the held-out one
    assert correct_guesses([2.0, 1.0], [1.0, 0.0], 2, 0) == 1
    # bottom two: 0 (out) and, in the tie at 1, the inserted one
    assert correct_guesses([2.0, 1.0], [1.0, 0.0], 0, 2) == 1
    assert correct_guesses([2.0, 1.5], [1.0, 0.0], 2, 2) == 4


def test_guess_grid() -> None:
    grid = guess_grid(1000)
    assert grid[:4] == ((62, 62), (500, 500), (250, 250), (125, 125))  # the favoured pair first
    assert (500, 0) in grid and (1000, 0) not in grid  # one-sided only up to m / 2
    assert min(k_plus + k_minus for k_plus, k_minus in grid) >= 10
    assert guess_grid(1) == ((1, 0),) and guess_grid(15)[0] == (8, 7)  # none under 16
    shares = grid_shares(1000, len(grid))
    assert shares[0] == 0.5 and sum(shares) == pytest.approx(1.0)
    assert grid_shares(15, 3) == [1 / 3] * 3


def test_the_default_grid_tests_its_favoured_pair_at_half_the_significance() -> None:
    ins, outs = gaussian_run(MU_AT_EPS_8, 1000, seed=1)
    grid = one_run_gdp(ins, outs)
    # the favoured pair alone at half the significance is a lower bound on the grid's result
    favoured = one_run_gdp(ins, outs, guesses=[(62, 62)], confidence=1 - 0.05 / 2)
    assert grid.epsilon >= favoured.epsilon > 0


def test_gdp_conversion() -> None:
    # delta at epsilon 0 is the total variation 2 Phi(mu / 2) - 1
    assert gdp_delta(1.0, 0.0) == pytest.approx(2 * PHI.cdf(0.5) - 1)
    # the Gaussian mechanism's sigma at (1, 1e-5) and (4, 1e-5), from dp_accounting's
    # get_sigma_gaussian (an independent implementation): mu = 1 / sigma
    assert gdp_mu(1.0, 1e-5) == pytest.approx(1 / 3.7306316348159374, rel=1e-9)
    assert gdp_mu(4.0, 1e-5) == pytest.approx(1 / 1.0811618495202397, rel=1e-9)
    assert gdp_mu(8.0, 1e-5) == pytest.approx(MU_AT_EPS_8, rel=1e-9)
    for eps in (0.5, 2.0, 8.0):
        assert gdp_epsilon(gdp_mu(eps, 1e-6), 1e-6) == pytest.approx(eps, abs=1e-8)
    assert gdp_epsilon(0.0, 1e-5) == 0.0


# --- the published method ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counts", "delta", "printed"),
    [
        ((1000, 100, 75), 1e-4, 0.673),  # Steinke et al., Appendix D's example
        ((100_000, 1510, 1439), 1e-5, 2.675),  # a result they print for m = 100,000
    ],
)
def test_the_papers_worked_numbers(counts: tuple[int, int, int], delta: float, printed: float):
    assert one_run_epsilon_from_counts(*counts, delta=delta, confidence=0.95) == pytest.approx(
        printed, abs=1e-3
    )


# jax_privacy's auditing module (google-deepmind/jax_privacy, commit 8967688c),
# _epsilon_one_run and _epsilon_one_run_fdp at significance 0.05, run on the same counts
REFERENCE = [
    ((1000, 200, 180), 1e-5, 1.796285, 2.901243),
    ((1000, 50, 50), 1e-5, 2.756219, 4.061915),
    ((1000, 500, 300), 1e-5, 0.251205, 0.438815),
    ((10000, 2000, 1900), 1e-6, 2.773000, 4.581995),
    ((200, 100, 90), 1e-3, 1.520262, 2.203183),
]


@pytest.mark.parametrize(("counts", "delta", "epsilon", "fdp_epsilon"), REFERENCE)
def test_counts_match_a_reference_implementation(
    counts: tuple[int, int, int], delta: float, epsilon: float, fdp_epsilon: float
) -> None:
    assert one_run_epsilon_from_counts(*counts, delta=delta) == pytest.approx(epsilon, abs=2e-5)
    mu = one_run_gdp_mu_from_counts(*counts)
    assert gdp_epsilon(mu, delta) == pytest.approx(fdp_epsilon, abs=2e-5)


def test_same_scores_match_a_reference_implementation() -> None:
    # the same run scored by jax_privacy's CanaryScoreAuditor with an Explicit threshold at the
    # 150th highest score (one-sided guesses): 2.25861 and 3.600131
    ins, outs = gaussian_run(MU_AT_EPS_8, 1000, seed=7)
    assert one_run_epsilon(ins, outs, guesses=[(150, 0)]).epsilon == pytest.approx(
        2.25861, abs=2e-5
    )
    found = one_run_gdp(ins, outs, guesses=[(150, 0)])
    assert (found.guesses, found.correct, found.pairs) == (150, 142, 1)
    assert found.epsilon == pytest.approx(3.600131, abs=2e-5)


# --- validity and power on the Gaussian mechanism ------------------------------------------


@pytest.mark.parametrize(("guesses", "true_eps"), [(60, 1.0), (200, 2.0)])
def test_randomized_response_exceeds_its_epsilon_at_most_five_percent(
    guesses: int, true_eps: float
) -> None:
    # epsilon-DP randomized response on every canary is the worst case of the theorem: the right
    # guesses are exactly Binomial(r, q). The chance that the 95% bound exceeds epsilon is then
    # computed exactly, and it is close to 5% from below (the bound is valid and sharp).
    q = 1 / (1 + math.exp(-true_eps))
    exceed = sum(
        binom.pmf(v, guesses, q)
        for v in range(guesses + 1)
        if one_run_epsilon_from_counts(guesses, guesses, v, delta=0.0) > true_eps
    )
    assert 0.03 < exceed <= 0.05


@pytest.mark.parametrize("true_eps", [2.0, 8.0])
def test_bounds_exceed_the_true_epsilon_rarely(true_eps: float) -> None:
    mu, seeds, canaries = gdp_mu(true_eps, 1e-5), 40, 200
    above = {"eps": 0, "gdp": 0, "eps-fixed": 0, "gdp-fixed": 0}
    for seed in range(seeds):
        ins, outs = gaussian_run(mu, canaries, seed)
        above["eps"] += one_run_epsilon(ins, outs).epsilon > true_eps
        above["gdp"] += one_run_gdp(ins, outs).mu > mu
        above["eps-fixed"] += one_run_epsilon(ins, outs, guesses=[(12, 12)]).epsilon > true_eps
        above["gdp-fixed"] += one_run_gdp(ins, outs, guesses=[(12, 12)]).mu > mu
    assert all(count <= 0.05 * seeds for count in above.values()), above


def test_the_gdp_bound_reaches_half_of_a_large_epsilon() -> None:
    # 1,000 canaries at true epsilon 8, one pair fixed in advance: the bound has power
    bounds = []
    for seed in range(5):
        ins, outs = gaussian_run(MU_AT_EPS_8, 1000, seed)
        bounds.append(one_run_gdp(ins, outs, guesses=[(62, 62)]).epsilon)
    assert 4.0 <= statistics.median(bounds) < 8.0


def test_a_split_confidence_is_more_conservative_than_one_pair() -> None:
    ins, outs = gaussian_run(MU_AT_EPS_8, 400, seed=3)
    grid = one_run_epsilon(ins, outs)
    alone = one_run_epsilon(ins, outs, guesses=[(grid.k_plus, grid.k_minus)])
    assert grid.pairs == len(guess_grid(400)) and alone.pairs == 1
    assert 0 < grid.epsilon < alone.epsilon


# --- AUROC and TPR at a fixed FPR ----------------------------------------------------------


def test_auroc_is_the_mann_whitney_statistic() -> None:
    ins, outs = gaussian_run(1.0, 300, seed=1)
    statistic = mannwhitneyu(ins, outs).statistic
    assert auroc(ins, outs) == pytest.approx(statistic / (ins.size * outs.size))
    # ties count half: one in against two outs, one below and one tied
    assert auroc([1.0], [0.0, 1.0]) == pytest.approx(0.75)


def test_tpr_at_fpr_by_hand() -> None:
    ins, outs = [5.0, 4.0, 3.0, 2.0], [4.5, 1.0, 0.5, 0.0]
    # 4 held out: FPR 1% allows none above the threshold 4.5, so only 5.0 counts
    assert tpr_at_fpr(ins, outs, 0.01) == 0.25
    # FPR 25% allows one: threshold 1.0, every inserted score is above it
    assert tpr_at_fpr(ins, outs, 0.25) == 1.0


def test_membership_metrics_extremes_and_intervals() -> None:
    separated = membership_metrics([2.0, 3.0, 4.0], [0.0, 1.0], resamples=50)
    assert separated.auroc == 1.0 and separated.auroc_interval == (1.0, 1.0)
    assert separated.tpr_at_fpr == {0.001: 1.0, 0.01: 1.0}
    same = membership_metrics([1.0] * 5, [1.0] * 5, resamples=50)
    assert same.auroc == 0.5 and same.tpr_at_fpr[0.01] == 0.0

    ins, outs = gaussian_run(1.0, 2000, seed=2)
    first = membership_metrics(ins, outs, resamples=200, seed=4)
    again = membership_metrics(ins, outs, resamples=200, seed=4)
    other = membership_metrics(ins, outs, resamples=200, seed=5)
    assert first == again and first.auroc_interval != other.auroc_interval
    low, high = first.auroc_interval
    assert low < first.auroc < high and high - low < 0.1
    for rate in (0.001, 0.01):
        low, high = first.tpr_intervals[rate]
        assert low <= first.tpr_at_fpr[rate] <= high


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: one_run_epsilon([], [1.0]), "in_scores is empty"),
        (lambda: one_run_epsilon([1.0], []), "out_scores is empty"),
        (lambda: one_run_gdp([1.0, math.nan], [1.0]), "not finite"),
        (lambda: one_run_epsilon([[1.0]], [1.0]), "one-dimensional"),
        (lambda: one_run_epsilon(["a"], [1.0]), "sequence of numbers"),
        (lambda: one_run_epsilon([1.0], [0.0], delta=0.0), "delta must be in (0, 1)"),
        (lambda: one_run_gdp([1.0], [0.0], delta=1.0), "delta must be in (0, 1)"),
        (lambda: one_run_epsilon([1.0], [0.0], confidence=1.0), "confidence must be in (0, 1)"),
        (lambda: one_run_epsilon([1.0], [0.0], guesses=[(2, 1)]), "at most the 2 canaries"),
        (lambda: one_run_gdp([1.0], [0.0], guesses=[(0, 0)]), "not both zero"),
        (lambda: one_run_gdp([1.0], [0.0], guesses=[]), "guesses is empty"),
        (lambda: one_run_gdp([1.0], [0.0], guesses=[(1.5, 0)]), "pairs of integers"),
        (lambda: one_run_epsilon_from_counts(10, 5, 6, delta=1e-5), "correct <= guesses"),
        (lambda: one_run_p_value(10, 5, 4, -1.0, 1e-5), "epsilon must be finite"),
        (lambda: membership_metrics([1.0], [0.0], fprs=(0.0,)), "fpr must be in (0, 1)"),
        (lambda: membership_metrics([1.0], [0.0], resamples=0), "resamples must be"),
        (lambda: gdp_epsilon(-1.0, 1e-5), "mu must be finite"),
    ],
)
def test_bad_input_is_one_line(call, message: str) -> None:
    with pytest.raises(GradleakError) as error:
        call()
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_importing_the_module_loads_no_torch() -> None:
    code = (
        "import sys, gradleak.evaluation.privacy_audit as audit\n"
        "audit.one_run_epsilon([1.0, 2.0], [0.0, 0.5])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
