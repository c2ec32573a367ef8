"""Privacy accounting of DP-SGD with opacus's accountants: epsilon for (q, sigma, steps, delta).

A client's round is ``steps`` applications of the subsampled Gaussian mechanism with sample
rate ``q`` and noise multiplier ``sigma``; the accountant composes them and converts the
result to (epsilon, delta)-DP. ``rdp`` is Rényi DP (Mironov 2017, the bound Abadi et al.'s
moments accountant gives); ``prv`` composes privacy-loss random variables numerically (Gopi et
al. 2021) and is tighter. Both assume Poisson sampling.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
from opacus.accountants import create_accountant

from gradleak.errors import GradleakError

ACCOUNTANTS = ("rdp", "prv")


@functools.lru_cache(maxsize=64)
def epsilon(accountant: str, sigma: float, sample_rate: float, steps: int, delta: float) -> float:
    """The epsilon that ``accountant`` (rdp | prv) gives after ``steps`` steps of noise
    multiplier ``sigma`` at ``sample_rate``, for ``delta``; ``inf`` when ``sigma`` is 0 (no
    noise, no guarantee)."""
    if accountant not in ACCOUNTANTS:
        raise GradleakError(f"unknown accountant '{accountant}': use one of {ACCOUNTANTS}")
    if sigma == 0:
        return math.inf
    tracker = create_accountant(mechanism=accountant)
    for _ in range(steps):
        tracker.step(noise_multiplier=sigma, sample_rate=sample_rate)
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        # rdp warns when its best order is the smallest one it tries: the bound is then looser
        # than it could be, but still a valid upper bound
        warnings.filterwarnings("ignore", "Optimal order is the smallest alpha")
        try:
            return float(tracker.get_epsilon(delta))
        except (RuntimeError, ValueError, OverflowError) as exc:
            fix = "use accountant=rdp" if accountant != "rdp" else "choose a larger sigma"
            raise GradleakError(
                f"the {accountant} accountant cannot bound epsilon for sigma={sigma}, "
                f"q={sample_rate}, {steps} steps, delta={delta} ({exc}): {fix}"
            ) from None
