"""Attacks by name: each name's settings model and the class it configures.

Adding an attack: a module with its settings model (a subclass of ``AttackSettings``, in a
module that imports no torch) and its class (a subclass of ``Attack``), and one
``ATTACKS.register`` line below. Other packages add theirs through the entry-point group
``gradleak.attacks`` (docs/extending.md), a notebook with ``gradleak.register_attack``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gradleak.attacks.dager.settings import DagerSettings
from gradleak.attacks.lti.settings import LtiPSettings, LtiSettings
from gradleak.attacks.optimization.settings import (
    DlgSettings,
    LampCosSettings,
    LampL2L1Settings,
    TagSettings,
)
from gradleak.attacks.settings import AttackSettings
from gradleak.registry import Registry

if TYPE_CHECKING:
    from gradleak.attacks.base import Attack

# The check that a new attack's options fit beside the others' is installed by
# ``gradleak.config.options``, which builds the options from these settings.
ATTACKS: Registry[AttackSettings] = Registry(
    "attack", "gradleak.attacks", "gradleak.attacks.base:Attack", AttackSettings
)
_OPTIMIZATION = "gradleak.attacks.optimization.engine:OptimizationAttack"
ATTACKS.register(_OPTIMIZATION, DlgSettings)
ATTACKS.register(_OPTIMIZATION, TagSettings)
ATTACKS.register(_OPTIMIZATION, LampCosSettings)
ATTACKS.register(_OPTIMIZATION, LampL2L1Settings)
ATTACKS.register("gradleak.attacks.dager.attack:DagerAttack", DagerSettings)
ATTACKS.register("gradleak.attacks.lti.attack:LtiAttack", LtiSettings)
ATTACKS.register("gradleak.attacks.lti.attack:LtiAttack", LtiPSettings)


def make_attack(name: str, **settings: Any) -> Attack:
    """Build attack ``name``; ``settings`` override its defaults (None values are ignored)."""
    given = {k: v for k, v in settings.items() if v is not None}
    return ATTACKS.build(ATTACKS.settings(name, **given))
