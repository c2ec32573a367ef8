"""The embedding-optimization attacks (DLG, TAG, LAMP): one engine (``engine``, its phases in
``phases``, several updates at once in ``stack``), their settings (``settings``), the attacker's
workspace and what it needs known (``workspace``, ``labels``), and its parts: what is matched
(``matching``), the matching loss without the dummy gradient (``ghost``), and LAMP's discrete
rounds and language-model prior (``discrete``). The names below load on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradleak.attacks.optimization.settings import (
    NO_PRIOR,
    DlgSettings,
    LampCosSettings,
    LampL2L1Settings,
    OptimizationSettings,
    TagSettings,
)
from gradleak.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from gradleak.attacks.optimization.engine import SCORE_MEMORY_BYTES, OptimizationAttack
    from gradleak.attacks.optimization.labels import (
        MAX_LABEL_ASSIGNMENTS,
        check_optimization_applies,
        label_assignments,
    )
    from gradleak.attacks.optimization.workspace import (
        DummyBatch,
        Workspace,
        allowed_token_mask,
        project_to_tokens,
    )

_ENGINE = "gradleak.attacks.optimization.engine"
_LABELS = "gradleak.attacks.optimization.labels"
_WORKSPACE = "gradleak.attacks.optimization.workspace"
__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "SCORE_MEMORY_BYTES": _ENGINE,
        "OptimizationAttack": _ENGINE,
        "MAX_LABEL_ASSIGNMENTS": _LABELS,
        "check_optimization_applies": _LABELS,
        "label_assignments": _LABELS,
        "DummyBatch": _WORKSPACE,
        "Workspace": _WORKSPACE,
        "allowed_token_mask": _WORKSPACE,
        "project_to_tokens": _WORKSPACE,
    },
)

__all__ = [
    "MAX_LABEL_ASSIGNMENTS",
    "NO_PRIOR",
    "SCORE_MEMORY_BYTES",
    "DlgSettings",
    "DummyBatch",
    "LampCosSettings",
    "LampL2L1Settings",
    "OptimizationAttack",
    "OptimizationSettings",
    "TagSettings",
    "Workspace",
    "allowed_token_mask",
    "check_optimization_applies",
    "label_assignments",
    "project_to_tokens",
]
