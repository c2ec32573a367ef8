"""Client-side defenses by name, and the ``--defense`` syntax.

Adding a defense: a module with its settings model (a subclass of ``DefenseSettings``) and its
class (a subclass of one of the stage classes in ``base``), and one ``DEFENSES.register`` line
below.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gradleak.defenses.base import (
    Defense,
    DefenseSettings,
    PrivateGradients,
    SampleDefense,
    Stage,
    UpdateDefense,
)
from gradleak.defenses.dpsgd import DpSgd, DpSgdSettings
from gradleak.defenses.noise import GaussianNoise, NoiseSettings
from gradleak.errors import GradleakError
from gradleak.federated.client import ClientUpdate, GlobalModel
from gradleak.registry import Registry

DEFENSES: Registry[DefenseSettings] = Registry("defense")
DEFENSES.register(GaussianNoise, NoiseSettings)
DEFENSES.register(DpSgd, DpSgdSettings)

NO_DEFENSE = "none"
SYNTAX = "NAME:KEY=VALUE,KEY=VALUE joined by + (e.g. noise:sigma=0.01+noise:sigma=0.1)"


def parse_defenses(text: str) -> list[dict[str, Any]]:
    """``"noise:sigma=0.01,relative=true+..."`` as ``[{"name": "noise", "sigma": "0.01",
    ...}, ...]`` (values stay text; the settings models convert them); ``none``: no defense."""
    text = text.strip()
    if text in ("", NO_DEFENSE):
        return []
    specs = []
    for part in text.split("+"):
        name, _, parameters = part.strip().partition(":")
        if not name.strip():
            raise GradleakError(f"bad --defense '{text}': use {SYNTAX}")
        spec: dict[str, Any] = {"name": name.strip()}
        for item in filter(None, (p.strip() for p in parameters.split(","))):
            key, equals, value = item.partition("=")
            if not equals or not key.strip():
                raise GradleakError(f"bad --defense parameter '{item}' in '{part}': use {SYNTAX}")
            spec[key.strip()] = value.strip()
        specs.append(spec)
    return specs


def format_defenses(defenses: Sequence[DefenseSettings]) -> str:
    """The ``--defense`` text of ``defenses`` (``none`` when empty)."""
    if not defenses:
        return NO_DEFENSE
    parts = []
    for settings in defenses:
        values = settings.model_dump(mode="json", exclude={"name"}, exclude_defaults=True)
        parameters = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                              for k, v in values.items())  # fmt: skip
        parts.append(f"{settings.name}:{parameters}" if parameters else settings.name)
    return "+".join(parts)


def build_defenses(settings: Sequence[DefenseSettings]) -> list[Defense]:
    """The scenario's defenses, in order; a stage this client cannot run is a one-line error.

    The client runs per-sample defenses (``SampleDefense``, at most one: it owns the local
    steps) inside its round and per-update defenses (``UpdateDefense``) on the update."""
    defenses = [DEFENSES.build(s) for s in settings]
    for defense in defenses:
        if not isinstance(defense, (UpdateDefense, SampleDefense)):
            raise GradleakError(
                f"defense {defense.name} acts {defense.stage.replace('_', ' ')}, which this "
                "client does not run: a defense it runs is an UpdateDefense or a SampleDefense"
            )
    per_sample = [d.name for d in defenses if isinstance(d, SampleDefense)]
    if len(per_sample) > 1:
        raise GradleakError(
            f"defenses {' and '.join(per_sample)} both act per sample in the client's steps: "
            "keep one"
        )
    return defenses


def privacy_facts(
    defenses: Sequence[Defense], global_model: GlobalModel, n_samples: int
) -> dict[str, Any]:
    """``{"privacy": ...}``: what the per-sample defense guarantees for a client round on
    ``n_samples`` examples (DP-SGD's epsilon), for the record; ``{}`` without one."""
    for defense in defenses:
        if isinstance(defense, SampleDefense):
            return {"privacy": defense.facts(global_model, n_samples)}
    return {}


def apply_update_defenses(
    update: ClientUpdate, defenses: Sequence[Defense], generator: torch.Generator
) -> ClientUpdate:
    """The update as the client sends it: each per-update defense applied in order."""
    for defense in defenses:
        if isinstance(defense, UpdateDefense):
            update = defense.apply(update, generator)
    return update


__all__ = [
    "DEFENSES",
    "NO_DEFENSE",
    "Defense",
    "DefenseSettings",
    "DpSgd",
    "DpSgdSettings",
    "GaussianNoise",
    "NoiseSettings",
    "PrivateGradients",
    "SampleDefense",
    "Stage",
    "UpdateDefense",
    "apply_update_defenses",
    "build_defenses",
    "format_defenses",
    "parse_defenses",
    "privacy_facts",
]
