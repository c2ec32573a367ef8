"""gradleak from Python: one attack run (:func:`attack`, what ``gradleak attack`` does), its
steps on in-memory objects (:func:`load_model`, :func:`client_update`, :func:`invert`,
:func:`score`), the :class:`Update` a client sends, and attacks or defenses of one's own
(:func:`register_attack`, :func:`register_defense`) and models or datasets
(:func:`register_model`, :func:`register_dataset`). Each loads its module on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradleak.renamed import renamed_attribute
from gradleak.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from gradleak.api.extend import (
        register_attack,
        register_dataset,
        register_defense,
        register_model,
    )
    from gradleak.api.runs import attack, replay
    from gradleak.api.steps import (
        Reconstruction,
        attack_update,
        client_update,
        invert,
        load_model,
        score,
    )
    from gradleak.api.update import BatchFacts, Known, Update

_STEPS = "gradleak.api.steps"
_UPDATE = "gradleak.api.update"
__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "register_attack": "gradleak.api.extend",
        "register_dataset": "gradleak.api.extend",
        "register_defense": "gradleak.api.extend",
        "register_model": "gradleak.api.extend",
        "attack": "gradleak.api.runs",
        "replay": "gradleak.api.runs",
        "Reconstruction": _STEPS,
        "attack_update": _STEPS,
        "client_update": _STEPS,
        "invert": _STEPS,
        "load_model": _STEPS,
        "score": _STEPS,
        "BatchFacts": _UPDATE,
        "Known": _UPDATE,
        "Update": _UPDATE,
    },
    renamed_attribute,
)

__all__ = [
    "BatchFacts",
    "Known",
    "Reconstruction",
    "Update",
    "attack",
    "attack_update",
    "client_update",
    "invert",
    "load_model",
    "register_attack",
    "register_dataset",
    "register_defense",
    "register_model",
    "replay",
    "score",
]
