"""DAGER (Petrov et al. 2024): exact gradient inversion through the span of layer gradients.
The names below load on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradleak.attacks.dager.settings import DagerSettings
from gradleak.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from gradleak.attacks.dager.attack import DagerAttack
    from gradleak.attacks.dager.check import DagerPlan
    from gradleak.attacks.dager.span import SpanBasis, estimate_rank, span_basis

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "DagerAttack": "gradleak.attacks.dager.attack",
        "DagerPlan": "gradleak.attacks.dager.check",
        "SpanBasis": "gradleak.attacks.dager.span",
        "estimate_rank": "gradleak.attacks.dager.span",
        "span_basis": "gradleak.attacks.dager.span",
    },
)

__all__ = ["DagerAttack", "DagerPlan", "DagerSettings", "SpanBasis", "estimate_rank", "span_basis"]
