"""Attacks by name. Each takes a client update and the server's knowledge, never the batch.

Adding an attack: a module with its settings model (a subclass of ``AttackSettings``) and its
class (a subclass of ``Attack``), and one ``ATTACKS.register`` line below. Other packages add
theirs through the entry-point group ``gradleak.attacks`` (docs/extending.md), a notebook
with ``gradleak.register_attack``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gradleak.attacks.base import (
    Attack,
    AttackFailed,
    AttackSettings,
    Plan,
    Reconstruction,
    Refusal,
)
from gradleak.attacks.dager import DagerAttack, DagerSettings
from gradleak.attacks.lti.attack import LtiAttack
from gradleak.attacks.lti.settings import LtiPSettings, LtiSettings
from gradleak.attacks.optimization import (
    DlgSettings,
    LampCosSettings,
    LampL2L1Settings,
    OptimizationAttack,
    OptimizationSettings,
    TagSettings,
)
from gradleak.registry import Entry, Registry


def _option_conflict(settings: type[BaseModel], registered: list[Entry[Any]]) -> str | None:
    """Whether a new attack's options collide with the scenario's or another attack's."""
    from gradleak.options import option_conflict  # the options are built from this registry

    return option_conflict(settings, [entry.settings for entry in registered])


ATTACKS: Registry[AttackSettings] = Registry(
    "attack", "gradleak.attacks", Attack, AttackSettings, check=_option_conflict
)
ATTACKS.register(OptimizationAttack, DlgSettings)
ATTACKS.register(OptimizationAttack, TagSettings)
ATTACKS.register(OptimizationAttack, LampCosSettings)
ATTACKS.register(OptimizationAttack, LampL2L1Settings)
ATTACKS.register(DagerAttack, DagerSettings)
ATTACKS.register(LtiAttack, LtiSettings)
ATTACKS.register(LtiAttack, LtiPSettings)


def make_attack(name: str, **settings: Any) -> Attack:
    """Build attack ``name``; ``settings`` override its defaults (None values are ignored)."""
    given = {k: v for k, v in settings.items() if v is not None}
    return ATTACKS.build(ATTACKS.settings(name, **given))


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
