"""Attacks by name. Each takes a client update and the server's knowledge, never the batch."""

from __future__ import annotations

from typing import Any

from gradleak.attacks.base import Attack, AttackFailed, Reconstruction
from gradleak.attacks.dager import DagerAttack, DagerSettings
from gradleak.attacks.optimization import OptimizationAttack, OptimizationSettings
from gradleak.errors import GradleakError

# LAMP's shared hyperparameters (the reference's lamp_cos.sh / lamp_l1l2.sh and its defaults).
_LAMP: dict[str, Any] = {
    "steps": 2000,
    "lr": 0.01,
    "lr_decay": 0.89,
    "lr_decay_every": 50,
    "n_init": 500,
    "rescale_init": True,
    "discrete_every": 75,
    "discrete_burnin": 0.1,
    "candidates": 200,
    "prior": "smollm2",
}

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
    "lamp-cos": (
        "LAMP_cos: cosine matching, 2-step init, norm regularizer, discrete reorderings scored "
        "with an LM prior (Balunovic et al. 2022, lamp_cos.sh)",
        {**_LAMP, "distance": "cos", "alpha_lm": 0.2, "alpha_reg": 1.0},
    ),
    "lamp-l2l1": (
        "LAMP_L2+L1: LAMP with TAG's L2 + 0.01 L1 matching (Balunovic et al. 2022, lamp_l1l2.sh)",
        {**_LAMP, "distance": "tag", "alpha_lm": 60.0, "alpha_reg": 25.0},
    ),
}


# Attacks that are not embedding optimizations: name -> (description, settings class, class).
EXACT_ATTACKS: dict[str, tuple[str, type, type]] = {
    "dager": (
        "DAGER: exact recovery from the span of layer-1/2 q/k/v gradients (Petrov et al. 2024)",
        DagerSettings,
        DagerAttack,
    ),
}


def make_attack(name: str, **settings: Any) -> Attack:
    """Build attack ``name``; ``settings`` override its defaults (None values are ignored)."""
    if name in EXACT_ATTACKS:
        _, settings_class, attack_class = EXACT_ATTACKS[name]
        given = {k: v for k, v in settings.items() if v is not None}
        try:
            return attack_class(settings_class(**given))
        except ValueError as exc:
            raise GradleakError(f"bad settings for attack {name}: {_first_error(exc)}") from None
    if name not in ATTACKS:
        known = ", ".join([*ATTACKS, *EXACT_ATTACKS])
        raise GradleakError(f"unknown attack '{name}': use one of {known}")
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
    "EXACT_ATTACKS",
    "Attack",
    "AttackFailed",
    "OptimizationAttack",
    "OptimizationSettings",
    "Reconstruction",
    "make_attack",
]
