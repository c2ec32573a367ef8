"""AUROC and TPR at a fixed FPR of the canaries' scores, with seeded bootstrap intervals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gradleak.errors import GradleakError

if TYPE_CHECKING:
    import numpy as np

from gradleak.evaluation.privacy_audit.guesses import (
    Scores,
    checked_scores,
    open_unit,
)


@dataclass(frozen=True)
class MembershipMetrics:
    """AUROC and TPR at fixed FPRs of the scores, each with a percentile bootstrap interval at
    ``confidence`` (``resamples`` resamplings of the inserted and the held-out scores apart,
    drawn from ``seed``)."""

    auroc: float
    auroc_interval: tuple[float, float]
    tpr_at_fpr: dict[float, float] = field(default_factory=dict)
    tpr_intervals: dict[float, tuple[float, float]] = field(default_factory=dict)
    confidence: float = 0.95
    resamples: int = 1000
    seed: int = 0


# --- AUROC and TPR at a fixed FPR ------------------------------------------------------------


def auroc(in_scores: Scores, out_scores: Scores) -> float:
    """The area under the ROC curve: the probability that an inserted canary outscores a
    held-out one, ties counting half (the Mann-Whitney statistic over n_in n_out)."""
    return float(
        _auroc(
            checked_scores(in_scores, "in_scores"), checked_scores(out_scores, "out_scores")[None]
        )[0]
    )


def tpr_at_fpr(in_scores: Scores, out_scores: Scores, fpr: float) -> float:
    """The largest true-positive rate of a threshold ("in" when the score is above it) whose
    false-positive rate on the held-out scores is at most ``fpr``: with n held-out canaries at
    most floor(fpr n) of them may score above the threshold (no interpolation)."""
    ins, outs = checked_scores(in_scores, "in_scores"), checked_scores(out_scores, "out_scores")
    open_unit(fpr, "fpr")
    return float(_tpr(ins[None], outs[None], fpr)[0])


def _auroc(ins: np.ndarray, outs: np.ndarray) -> np.ndarray:
    """AUROC of each row: ``ins`` (n_in,) or (B, n_in) against ``outs`` (B, n_out)."""
    import numpy as np

    ins = np.broadcast_to(ins, (outs.shape[0], ins.shape[-1]))
    wins = np.empty(outs.shape[0])  # twice the held-out scores below, ties counting once
    for row, (held_out, inserted) in enumerate(zip(np.sort(outs, axis=1), ins, strict=True)):
        below = np.searchsorted(held_out, inserted, side="left")
        upto = np.searchsorted(held_out, inserted, side="right")
        wins[row] = (below + upto).sum()
    return wins / (2.0 * ins.shape[1] * outs.shape[1])


def _tpr(ins: np.ndarray, outs: np.ndarray, fpr: float) -> np.ndarray:
    """TPR at ``fpr`` of each row of ``ins`` (B, n_in) against ``outs`` (B, n_out)."""
    import numpy as np

    allowed = math.floor(fpr * outs.shape[1] + 1e-9)  # false positives allowed
    if allowed >= outs.shape[1]:
        return np.ones(ins.shape[0])
    ordered = np.sort(outs, axis=1)
    threshold = ordered[:, outs.shape[1] - 1 - allowed]  # the (allowed + 1)-th highest
    return (ins > threshold[:, None]).mean(axis=1)


def membership_metrics(
    in_scores: Scores,
    out_scores: Scores,
    *,
    fprs: Sequence[float] = (0.001, 0.01),
    confidence: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> MembershipMetrics:
    """AUROC and TPR at each of ``fprs`` (:func:`auroc`, :func:`tpr_at_fpr`) with percentile
    bootstrap intervals at ``confidence``: ``resamples`` times the inserted and the held-out
    scores are resampled apart, with replacement, from a generator seeded with ``seed``. The
    intervals describe the attack's measurement noise, not a privacy guarantee."""
    import numpy as np

    ins, outs = checked_scores(in_scores, "in_scores"), checked_scores(out_scores, "out_scores")
    level = open_unit(confidence, "confidence")
    rates = tuple(open_unit(rate, "fpr") for rate in fprs)
    if not isinstance(resamples, int) or isinstance(resamples, bool) or resamples < 1:
        raise GradleakError(f"resamples must be a positive integer, got {resamples!r}")
    generator = np.random.default_rng(seed)
    in_boot = ins[generator.integers(0, ins.size, size=(resamples, ins.size))]
    out_boot = outs[generator.integers(0, outs.size, size=(resamples, outs.size))]
    tail = (1 - level) / 2

    def interval(values: np.ndarray) -> tuple[float, float]:
        low, high = np.quantile(values, [tail, 1 - tail])
        return float(low), float(high)

    return MembershipMetrics(
        auroc=float(_auroc(ins, outs[None])[0]),
        auroc_interval=interval(_auroc(in_boot, out_boot)),
        tpr_at_fpr={rate: float(_tpr(ins[None], outs[None], rate)[0]) for rate in rates},
        tpr_intervals={rate: interval(_tpr(in_boot, out_boot, rate)) for rate in rates},
        confidence=level,
        resamples=resamples,
        seed=seed,
    )
