"""Defenses by name, and the ``--defense`` syntax.

Adding a defense: its settings model (a subclass of ``DefenseSettings``, in ``settings``), its
class (a subclass of one of the stage classes in ``base``) in a module of its own, and one
``DEFENSES.register`` line below. Other packages add theirs through the entry-point group
``gradleak.defenses`` (docs/extending.md), a notebook with ``gradleak.register_defense``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gradleak.defenses.settings import (
    DefenseSettings,
    DpSgdSettings,
    NoiseSettings,
    PruneSettings,
    SecAggSettings,
    SignSettings,
)
from gradleak.errors import GradleakError, one_line
from gradleak.registry import Registry

DEFENSES: Registry[DefenseSettings] = Registry(
    "defense", "gradleak.defenses", "gradleak.defenses.base:Defense", DefenseSettings
)
DEFENSES.register("gradleak.defenses.noise:GaussianNoise", NoiseSettings)
DEFENSES.register("gradleak.defenses.prune:TopKPruning", PruneSettings)
DEFENSES.register("gradleak.defenses.sign:SignCompression", SignSettings)
DEFENSES.register("gradleak.defenses.secagg:SecureAggregation", SecAggSettings)
DEFENSES.register("gradleak.defenses.dpsgd:DpSgd", DpSgdSettings)

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
            raise GradleakError(f"bad --defense '{one_line(text[:80])}': use {SYNTAX}")
        spec: dict[str, Any] = {"name": name.strip()}
        for item in filter(None, (p.strip() for p in parameters.split(","))):
            key, equals, value = item.partition("=")
            if not equals or not key.strip():
                raise GradleakError(
                    f"bad --defense parameter '{one_line(item[:80])}' in "
                    f"'{one_line(part[:80])}': use {SYNTAX}"
                )
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
