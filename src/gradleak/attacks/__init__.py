"""Attacks by name. Each takes a client update and the server's knowledge, never the batch."""

from __future__ import annotations

from typing import Any

from gradleak.attacks.base import Attack, AttackFailed, Reconstruction
from gradleak.attacks.optimization import OptimizationAttack, OptimizationSettings
from gradleak.errors import GradleakError

# name -> (description, the settings that differ from OptimizationSettings' defaults)
ATTACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "dlg": (
        "DLG: squared-L2 gradient matching (Zhu et al. 2019, as run by LAMP)",
        {"distance": "l2"},
    ),
    "tag": (
        "TAG: L2 + 0.01 L1 gradient matching (Deng et al. 2021, as run by LAMP)",
        {"distance": "tag"},
    ),
}


def make_attack(name: str, **settings: Any) -> Attack:
    """Build attack ``name``; ``settings`` override its defaults (None values are ignored)."""
    if name not in ATTACKS:
        raise GradleakError(f"unknown attack '{name}': use one of {', '.join(ATTACKS)}")
    _, defaults = ATTACKS[name]
    given = {k: v for k, v in settings.items() if v is not None}
    try:
        return OptimizationAttack(name, OptimizationSettings(**{**defaults, **given}))
    except ValueError as exc:
        raise GradleakError(f"bad settings for attack {name}: {_first_error(exc)}") from None


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(exc).splitlines()[0]


__all__ = [
    "ATTACKS",
    "Attack",
    "AttackFailed",
    "OptimizationAttack",
    "OptimizationSettings",
    "Reconstruction",
    "make_attack",
]
