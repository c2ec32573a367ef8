"""One set of canary scores summed up: both one-run bounds, AUROC, and the most that as many
canaries could show, so that a small bound can be read as "the canaries were too few" or "the
run hid them"."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gradleak.evaluation.privacy_audit.gdp import one_run_gdp
from gradleak.evaluation.privacy_audit.guesses import Scores, checked_scores
from gradleak.evaluation.privacy_audit.membership import auroc
from gradleak.evaluation.privacy_audit.one_run import one_run_epsilon


@dataclass(frozen=True)
class EmpiricalEpsilon:
    """Lower bounds on epsilon at ``delta`` from one run's canaries, at ``confidence``.

    ``gdp_epsilon`` is the Gaussian-DP bound's epsilon (:func:`one_run_gdp`), ``epsilon`` the
    (epsilon, delta) bound (:func:`one_run_epsilon`); ``ceiling`` is the Gaussian-DP epsilon
    these canary counts give when every guess is right: no run, however leaky, shows more
    with as many canaries.
    """

    canaries: int
    inserted: int
    gdp_epsilon: float
    epsilon: float
    ceiling: float
    auroc: float
    delta: float
    confidence: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def empirical_epsilon(
    in_scores: Scores, out_scores: Scores, *, delta: float = 1e-5, confidence: float = 0.95
) -> EmpiricalEpsilon:
    """Both one-run bounds of the scores (over the default guess grid), AUROC, and the
    ceiling: the same counts perfectly separated."""
    ins, outs = checked_scores(in_scores, "in_scores"), checked_scores(out_scores, "out_scores")
    separated = ([1.0] * ins.size, [0.0] * outs.size)
    return EmpiricalEpsilon(
        canaries=ins.size + outs.size,
        inserted=ins.size,
        gdp_epsilon=one_run_gdp(ins, outs, delta=delta, confidence=confidence).epsilon,
        epsilon=one_run_epsilon(ins, outs, delta=delta, confidence=confidence).epsilon,
        ceiling=one_run_gdp(*separated, delta=delta, confidence=confidence).epsilon,
        auroc=auroc(ins, outs),
        delta=delta,
        confidence=confidence,
    )
