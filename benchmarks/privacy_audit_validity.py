"""Validity and tightness of the one-run privacy auditors (``gradleak.evaluation.privacy_audit``).

``python benchmarks/privacy_audit_validity.py [--seeds 200] [--canaries 1000 ...] [--out DIR]``

The Gaussian mechanism with a known privacy curve: each of m canaries is inserted with
probability 1/2 and its score is mu times its indicator plus N(0, 1) noise, so the released
scores are exactly mu-GDP in each canary, and (epsilon, delta)-DP with epsilon =
``gdp_epsilon(mu, delta)`` and no smaller. mu is set so that the true epsilon at delta 1e-5 is
1, 2, 4 and 8. For every seed both bounds are computed twice: over the default grid of guesses
(the confidence split among the pairs) and for one pair fixed before seeing any score, k+ = k-
= m/16 (tested at the full confidence). A valid 95% bound exceeds the true epsilon in at most
5% of the seeds; tight means its median reaches half the true epsilon.

A second table checks the (epsilon, delta) bound against the numbers the paper works out (its
Appendix D example, and a result it prints for m = 100,000). Both tables go to ``--out``
(``benchmarks/results/`` by default, ignored by git) as JSON and markdown, with the machine,
the versions and the wall time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from report import write_results

from gradleak.evaluation.privacy_audit import (
    gdp_mu,
    one_run_epsilon,
    one_run_epsilon_from_counts,
    one_run_gdp,
)

# (where in Steinke, Nasr & Jagielski, arXiv:2305.08846v1; canaries, guesses, correct, delta,
# confidence, the epsilon they print)
PUBLISHED = (
    ("Appendix D, the worked example of its code", 1000, 100, 75, 1e-4, 0.95, 0.673),
    ("a printed result, m = 100,000", 100_000, 1510, 1439, 1e-5, 0.95, 2.675),
)
METHODS = ("one-run eps", "one-run GDP")


def simulate(mu: float, canaries: int, generator: np.random.Generator):
    """The inserted and the held-out canaries' scores of one run of the Gaussian mechanism."""
    inserted = generator.random(canaries) < 0.5
    scores = mu * inserted + generator.standard_normal(canaries)
    return scores[inserted], scores[~inserted]


def validity(
    epsilons: list[float], canaries: int, seeds: int, delta: float, confidence: float
) -> list[dict]:
    k = max(canaries // 16, 1)
    rows = []
    for index, true_eps in enumerate(epsilons):
        mu = gdp_mu(true_eps, delta)
        found: dict[tuple[str, str], list[float]] = {}
        seconds: dict[tuple[str, str], float] = {}
        for seed in range(seeds):
            ins, outs = simulate(mu, canaries, np.random.default_rng([seed, index, canaries]))
            for guesses, label in ((None, "grid"), ([(k, k)], f"k+=k-={k}")):
                for method in METHODS:
                    started = time.perf_counter()
                    if method == "one-run eps":
                        bound = one_run_epsilon(
                            ins, outs, delta=delta, confidence=confidence, guesses=guesses
                        ).epsilon
                    else:
                        bound = one_run_gdp(
                            ins, outs, delta=delta, confidence=confidence, guesses=guesses
                        ).epsilon
                    key = (method, label)
                    seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - started
                    found.setdefault(key, []).append(bound)
        for (method, label), bounds in found.items():
            above = sum(bound > true_eps for bound in bounds)
            median = statistics.median(bounds)
            rows.append(
                {
                    "true eps": true_eps,
                    "mu": round(mu, 4),
                    "bound": method,
                    "guesses": label,
                    "m": canaries,
                    "seeds": seeds,
                    "above true": above,
                    "above rate": above / seeds,
                    "median": median,
                    "mean": statistics.fmean(bounds),
                    "p5": float(np.quantile(bounds, 0.05)),
                    "p95": float(np.quantile(bounds, 0.95)),
                    "median / true": median / true_eps,
                    "half reached": "yes" if median >= true_eps / 2 else "no",
                    "ms per audit": 1000 * seconds[(method, label)] / seeds,
                }
            )
            print(rows[-1], flush=True)
    return rows


def published() -> list[dict]:
    rows = []
    for where, m, r, v, delta, confidence, printed in PUBLISHED:
        ours = one_run_epsilon_from_counts(m, r, v, delta=delta, confidence=confidence)
        rows.append(
            {
                "paper": where,
                "m": m,
                "guesses": r,
                "correct": v,
                "delta": delta,
                "confidence": confidence,
                "printed": printed,
                "ours": round(ours, 5),
                "difference": round(ours - printed, 5),
            }
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--canaries", type=int, nargs="+", default=[1000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()

    started = time.perf_counter()
    rows = []
    for canaries in args.canaries:
        rows += validity(args.epsilons, canaries, args.seeds, args.delta, args.confidence)
    notes = (
        "The Gaussian mechanism: m canaries, each inserted with probability 1/2, "
        f"score = mu * inserted + N(0, 1), mu set so that the true epsilon at delta "
        f"{args.delta:g} is the first column; {args.seeds} seeds each. Bounds at confidence "
        f"{args.confidence:g}: Steinke et al.'s (epsilon, delta) ('one-run eps') and "
        "Mahloujifar et al.'s Gaussian DP converted to epsilon at delta ('one-run GDP'); "
        "'grid' tries the default (k+, k-) pairs with the confidence split among them, "
        "'k+=k-=K' one pair fixed in advance (m/16). 'above true' counts the seeds whose bound "
        "exceeds the true epsilon (a valid bound: at most 5%); 'half reached': the median "
        "reaches half the true epsilon."
    )
    for path in write_results(args.out, "privacy_audit_validity", rows, started, notes):
        print(f"wrote {path}")
    started = time.perf_counter()
    notes = (
        "Steinke et al.'s bound from the counts the paper works out: m canaries, r guesses, "
        "v of them right; 'printed' is the epsilon the paper prints, 'ours' "
        "one_run_epsilon_from_counts on the same counts."
    )
    for path in write_results(args.out, "privacy_audit_published", published(), started, notes):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
