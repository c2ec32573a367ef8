"""A scenario's defenses built and applied in order: each stage where the mathematics puts it
(per sample in the client's steps, per update after them, across clients at the server)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from gradleak.defenses.base import (
    AcrossClientsDefense,
    Defense,
    SampleDefense,
    UpdateDefense,
)
from gradleak.defenses.registry import DEFENSES
from gradleak.defenses.settings import DefenseSettings
from gradleak.errors import GradleakError
from gradleak.federated.payload import UpdatePayload

if TYPE_CHECKING:
    from gradleak.federated.client import GlobalModel


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
    update: UpdatePayload, defenses: Sequence[Defense], generator: torch.Generator
) -> UpdatePayload:
    """The update as the client sends it: each per-update defense applied in order."""
    for defense in defenses:
        if isinstance(defense, UpdateDefense):
            update = defense.apply(update, generator)
    return update
