"""DAGER (Petrov et al. 2024): exact gradient inversion through the span of layer gradients."""

from gradleak.attacks.dager.attack import DagerAttack
from gradleak.attacks.dager.check import DagerPlan
from gradleak.attacks.dager.settings import DagerSettings
from gradleak.attacks.dager.span import SpanBasis, estimate_rank, span_basis

__all__ = [
    "DagerAttack",
    "DagerPlan",
    "DagerSettings",
    "SpanBasis",
    "estimate_rank",
    "span_basis",
]
