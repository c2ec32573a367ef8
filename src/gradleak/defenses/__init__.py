"""Client-side defenses by name, and the ``--defense`` syntax.

Adding a defense: a module with its settings model (a subclass of ``DefenseSettings``) and its
class (a subclass of one of the stage classes in ``base``), and one ``DEFENSES.register`` line
below. Other packages add theirs through the entry-point group ``gradleak.defenses``
(docs/extending.md), a notebook with ``gradleak.register_defense``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gradleak.defenses.base import (
    AcrossClientsDefense,
    Defense,
    DefenseSettings,
    PrivateGradients,
    RowwiseDefense,
    SampleDefense,
    Stage,
    UpdateDefense,
)
from gradleak.defenses.dpsgd import DpSgd, DpSgdSettings
from gradleak.defenses.noise import GaussianNoise, NoiseSettings
from gradleak.defenses.prune import PruneSettings, TopKPruning
from gradleak.defenses.secagg import SecAggSettings, SecureAggregation
from gradleak.defenses.sign import SignCompression, SignSettings
from gradleak.errors import GradleakError
from gradleak.federated.client import ClientUpdate, GlobalModel
from gradleak.registry import Registry

DEFENSES: Registry[DefenseSettings] = Registry(
    "defense", "gradleak.defenses", Defense, DefenseSettings
)
DEFENSES.register(GaussianNoise, NoiseSettings)
DEFENSES.register(TopKPruning, PruneSettings)
DEFENSES.register(SignCompression, SignSettings)
DEFENSES.register(SecureAggregation, SecAggSettings)
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
    """The scenario's defenses, in order; a stage this client cannot run, more than one
    per-sample defense (it owns the local steps) or more than one combination of clients is a
    one-line error."""
    defenses = [DEFENSES.build(s) for s in settings]
    for defense in defenses:
        if not isinstance(defense, (UpdateDefense, SampleDefense, AcrossClientsDefense)):
            raise GradleakError(
                f"defense {defense.name} acts {defense.stage.replace('_', ' ')}, which this "
                "client does not run: use a per-update, per-sample or across-clients defense"
            )
    for kind, what in ((SampleDefense, "act per sample in the client's steps"),
                       (AcrossClientsDefense, "combine clients")):  # fmt: skip
        names = [d.name for d in defenses if isinstance(d, kind)]
        if len(names) > 1:
            raise GradleakError(f"defenses {' and '.join(names)} both {what}: keep one of them")
    return defenses


def clients_of(defenses: Sequence[Defense]) -> int:
    """How many clients' updates the server combines (1 without an across-clients defense)."""
    return next((d.clients for d in defenses if isinstance(d, AcrossClientsDefense)), 1)


def noise_std(
    defenses: Sequence[DefenseSettings],
    received: torch.Tensor,
    base: float = 0.0,
    metadata: Mapping[str, Any] | None = None,
) -> float:
    """The standard deviation of the random noise per entry of ``received`` that the
    ``defenses`` (settings, in order, as the server's knowledge holds them) put there, on top
    of ``base`` (e.g. a weight delta's own rounding noise); ``metadata``: the update's."""
    variance = base**2
    for settings in defenses:
        variance = DEFENSES.build(settings).noise_variance(variance, received, metadata or {})
    return math.sqrt(variance)


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
    "AcrossClientsDefense",
    "Defense",
    "DefenseSettings",
    "DpSgd",
    "DpSgdSettings",
    "GaussianNoise",
    "NoiseSettings",
    "PruneSettings",
    "SecAggSettings",
    "SecureAggregation",
    "SignCompression",
    "SignSettings",
    "TopKPruning",
    "PrivateGradients",
    "RowwiseDefense",
    "SampleDefense",
    "Stage",
    "UpdateDefense",
    "apply_update_defenses",
    "build_defenses",
    "clients_of",
    "format_defenses",
    "noise_std",
    "parse_defenses",
    "privacy_facts",
]
