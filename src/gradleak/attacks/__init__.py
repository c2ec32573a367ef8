"""Attacks: each takes a client update and the server's knowledge, never the batch.

The contract (:mod:`~gradleak.attacks.base`, settings in :mod:`~gradleak.attacks.settings`),
the registry of attacks by name (:mod:`~gradleak.attacks.registry`), the adaptations to public
defenses that the families share (:mod:`~gradleak.attacks.adaptive`), and the families:
:mod:`~gradleak.attacks.optimization` (DLG, TAG, LAMP), :mod:`~gradleak.attacks.dager`,
:mod:`~gradleak.attacks.lti`. The classes below load with their modules, on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradleak.attacks.registry import ATTACKS, make_attack
from gradleak.attacks.settings import AttackSettings
from gradleak.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from gradleak.attacks.base import Attack, AttackFailed, Plan, Reconstruction, Refusal
    from gradleak.attacks.optimization.engine import OptimizationAttack
    from gradleak.attacks.optimization.settings import OptimizationSettings

__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "Attack": "gradleak.attacks.base",
        "AttackFailed": "gradleak.attacks.base",
        "Plan": "gradleak.attacks.base",
        "Reconstruction": "gradleak.attacks.base",
        "Refusal": "gradleak.attacks.base",
        "OptimizationAttack": "gradleak.attacks.optimization.engine",
        "OptimizationSettings": "gradleak.attacks.optimization.settings",
    },
)

__all__ = [
    "ATTACKS",
    "Attack",
    "AttackFailed",
    "AttackSettings",
    "OptimizationAttack",
    "OptimizationSettings",
    "Plan",
    "Reconstruction",
    "Refusal",
    "make_attack",
]
