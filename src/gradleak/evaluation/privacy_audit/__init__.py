"""Empirical privacy from canary scores: epsilon lower bounds beside the accountant's upper one.

m canaries are drawn; each is inserted into the training data independently with probability
1/2 (Poisson inclusion) and the rest are held out. After one training run an attack gives every
canary a score, higher meaning "more likely inserted". From the scores of the inserted canaries
(``in_scores``) and of the held-out ones (``out_scores``) this module measures:

- :func:`one_run_epsilon`: the (epsilon, delta) lower bound of Steinke, Nasr & Jagielski,
  "Privacy auditing with one (1) training run" (NeurIPS 2023; arXiv:2305.08846);
- :func:`one_run_gdp`: the Gaussian-DP lower bound mu of Mahloujifar, Melis & Chaudhuri,
  "Auditing f-differential privacy in one run" (ICML 2025; arXiv:2410.22235), and the epsilon
  at delta that mu implies;
- :func:`membership_metrics`: AUROC and TPR at a fixed FPR, with seeded bootstrap intervals;
- :func:`empirical_epsilon`: both bounds, AUROC, and the most as many canaries could show.

Both bounds hold at confidence 1 - beta under two assumptions: (a) Poisson inclusion, each
canary in or out by its own fair coin, independent of the other canaries and of the rest of
the data; (b) the guesses are a function of the training run's output only (the scores), never
of the coins. Neither assumes anything of the attack: a weak attack gives a low bound, never a
wrong one. Theorem numbers refer to the arXiv versions.

The guesses: the top k+ scores are guessed "in" and the bottom k- "out"; the auditor abstains
on the rest. Ties are broken against the auditor (held-out canaries rank above inserted ones
within a tie), so a count is never above that of any tie-break that ignores the labels. By
default both bounds try the pairs of :func:`guess_grid` and split the significance among
them (Bonferroni, :func:`grid_shares`: half of beta for the favoured pair, m/16 "in" and m/16
"out", the other half evenly among the rest), so the best pair's bound is still a valid bound
at 1 - beta (the best of several k without a correction would overstate the confidence).
Pairs passed as ``guesses=[(k_plus, k_minus), ...]`` share beta evenly; one alone is tested at
beta.

numpy and scipy are imported inside the functions that need them; torch is never imported. The
parts: :mod:`.guesses` (the scores checked, the guesses), :mod:`.one_run` (Steinke et al.),
:mod:`.gdp` (Mahloujifar et al., mu-GDP and (epsilon, delta)), :mod:`.membership` (AUROC, TPR),
:mod:`.summary` (one set of scores summed up).
"""

from gradleak.evaluation.privacy_audit.gdp import (
    OneRunGdp,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    gdp_rejects,
    one_run_gdp,
    one_run_gdp_mu_from_counts,
)
from gradleak.evaluation.privacy_audit.guesses import (
    MIN_GUESSES,
    Guesses,
    Scores,
    correct_guesses,
    grid_shares,
    guess_grid,
)
from gradleak.evaluation.privacy_audit.membership import (
    MembershipMetrics,
    auroc,
    membership_metrics,
    tpr_at_fpr,
)
from gradleak.evaluation.privacy_audit.one_run import (
    OneRunEpsilon,
    one_run_epsilon,
    one_run_epsilon_from_counts,
    one_run_p_value,
)
from gradleak.evaluation.privacy_audit.summary import EmpiricalEpsilon, empirical_epsilon

__all__ = [
    "MIN_GUESSES",
    "EmpiricalEpsilon",
    "Guesses",
    "MembershipMetrics",
    "OneRunEpsilon",
    "OneRunGdp",
    "Scores",
    "auroc",
    "correct_guesses",
    "empirical_epsilon",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "gdp_rejects",
    "grid_shares",
    "guess_grid",
    "membership_metrics",
    "one_run_epsilon",
    "one_run_epsilon_from_counts",
    "one_run_gdp",
    "one_run_gdp_mu_from_counts",
    "one_run_p_value",
    "tpr_at_fpr",
]
