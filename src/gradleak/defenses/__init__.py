"""Client-side defenses: the contract (:mod:`~gradleak.defenses.base`, a stage class per place a
defense acts), every defense's settings (:mod:`~gradleak.defenses.settings`), the registry and
the ``--defense`` syntax (:mod:`~gradleak.defenses.registry`), a scenario's defenses built and
applied in order (:mod:`~gradleak.defenses.chain`), one round as the server receives it
(:mod:`~gradleak.defenses.round`), and one module per defense. The classes and functions below
load with their modules, on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradleak.defenses.registry import (
    DEFENSES,
    NO_DEFENSE,
    SYNTAX,
    format_defenses,
    parse_defenses,
)
from gradleak.defenses.settings import (
    DefenseSettings,
    DpSgdSettings,
    NoiseSettings,
    PruneSettings,
    SecAggSettings,
    SignSettings,
)
from gradleak.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from gradleak.defenses.base import (
        AcrossClientsDefense,
        Defense,
        RowwiseDefense,
        SampleDefense,
        Stage,
        UpdateDefense,
    )
    from gradleak.defenses.chain import (
        apply_update_defenses,
        build_defenses,
        clients_of,
        noise_std,
        privacy_facts,
    )
    from gradleak.defenses.dpsgd import DpSgd
    from gradleak.defenses.noise import GaussianNoise
    from gradleak.defenses.prune import TopKPruning
    from gradleak.defenses.secagg import SecureAggregation
    from gradleak.defenses.sign import SignCompression
    from gradleak.federated.private import PrivateGradients

_BASE = "gradleak.defenses.base"
_CHAIN = "gradleak.defenses.chain"
__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "AcrossClientsDefense": _BASE,
        "Defense": _BASE,
        "RowwiseDefense": _BASE,
        "SampleDefense": _BASE,
        "Stage": _BASE,
        "UpdateDefense": _BASE,
        "apply_update_defenses": _CHAIN,
        "build_defenses": _CHAIN,
        "clients_of": _CHAIN,
        "noise_std": _CHAIN,
        "privacy_facts": _CHAIN,
        "DpSgd": "gradleak.defenses.dpsgd",
        "GaussianNoise": "gradleak.defenses.noise",
        "TopKPruning": "gradleak.defenses.prune",
        "SecureAggregation": "gradleak.defenses.secagg",
        "SignCompression": "gradleak.defenses.sign",
        "PrivateGradients": "gradleak.federated.private",
    },
)

__all__ = [
    "DEFENSES",
    "NO_DEFENSE",
    "SYNTAX",
    "AcrossClientsDefense",
    "Defense",
    "DefenseSettings",
    "DpSgd",
    "DpSgdSettings",
    "GaussianNoise",
    "NoiseSettings",
    "PrivateGradients",
    "PruneSettings",
    "RowwiseDefense",
    "SampleDefense",
    "SecAggSettings",
    "SecureAggregation",
    "SignCompression",
    "SignSettings",
    "Stage",
    "TopKPruning",
    "UpdateDefense",
    "apply_update_defenses",
    "build_defenses",
    "clients_of",
    "format_defenses",
    "noise_std",
    "parse_defenses",
    "privacy_facts",
]
