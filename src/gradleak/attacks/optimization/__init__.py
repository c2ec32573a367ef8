"""The embedding-optimization attacks: one engine (``engine``), their settings (``settings``),
the attacker's workspace and what they need known (``workspace``, ``labels``)."""

from gradleak.attacks.optimization.engine import SCORE_MEMORY_BYTES, OptimizationAttack
from gradleak.attacks.optimization.labels import (
    MAX_LABEL_ASSIGNMENTS,
    check_optimization_applies,
    label_assignments,
)
from gradleak.attacks.optimization.settings import (
    NO_PRIOR,
    DlgSettings,
    LampCosSettings,
    LampL2L1Settings,
    OptimizationSettings,
    TagSettings,
)
from gradleak.attacks.optimization.workspace import (
    DummyBatch,
    Workspace,
    allowed_token_mask,
    project_to_tokens,
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
