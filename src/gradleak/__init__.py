"""gradleak: how much private text leaks from federated fine-tuning updates.

Each command of ``gradleak`` is one call here::

    import gradleak

    record = gradleak.attack(model="minilm", attack="dager", batch_size=2, mode="eval")
    model, tokenizer = gradleak.load_model("minilm")
    update = gradleak.client_update(model, tokenizer, ["a private note"], [1], mode="eval")
    found = gradleak.invert(update, model, tokenizer, "dager")
    gradleak.score(["a private note"], found.texts).strict.exact_match

    folder = gradleak.run_experiment("configs/papers/dager-encoder.yaml").folder  # gradleak run
    gradleak.write_report(folder)                                                 # gradleak report
    print(gradleak.run_audit("configs/audit/demo.yaml", budget_s=600).verdict)  # gradleak audit

Importing the package is cheap: each name loads its module the first time it is used (torch
and transformers with it). Bad input raises :class:`GradleakError` with one line that names the
problem and the fix. Your own attack or defense subclasses :class:`Attack` or :class:`Defense`
and is registered with :func:`register_attack` / :func:`register_defense`, or, from an
installed package, through the entry points ``gradleak.attacks`` / ``gradleak.defenses``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradleak import renamed
from gradleak.errors import (
    GradleakDeprecation,
    GradleakError,
    GradleakNotice,
    MissingDependencyError,
    OptionError,
    UpdateMismatchError,
)
from gradleak.runtime.lazy import lazy_exports
from gradleak.version import __version__

if TYPE_CHECKING:
    from gradleak.api import (
        Reconstruction,
        Update,
        attack,
        client_update,
        invert,
        load_model,
        register_attack,
        register_dataset,
        register_defense,
        register_model,
        replay,
        score,
    )
    from gradleak.attacks import Attack, AttackSettings
    from gradleak.audit import run_audit
    from gradleak.config import RunConfig
    from gradleak.defenses import Defense, DefenseSettings
    from gradleak.evaluation.utility import measure_utility
    from gradleak.experiments import run_experiment
    from gradleak.reports import write_report
    from gradleak.running.record import Metrics, Record, load_record
    from gradleak.runtime.tuning import tune_process

# name -> the module that defines it, imported when the name is first used
_EXPORTS = {
    **dict.fromkeys(
        (
            "Reconstruction",
            "Update",
            "attack",
            "client_update",
            "invert",
            "load_model",
            "register_attack",
            "register_dataset",
            "register_defense",
            "register_model",
            "replay",
            "score",
        ),
        "gradleak.api",
    ),
    "Attack": "gradleak.attacks",
    "AttackSettings": "gradleak.attacks.settings",
    "Defense": "gradleak.defenses",
    "DefenseSettings": "gradleak.defenses",
    "RunConfig": "gradleak.config.run",
    "Metrics": "gradleak.running.record",
    "Record": "gradleak.running.record",
    "load_record": "gradleak.running.record",
    "run_experiment": "gradleak.experiments",
    "write_report": "gradleak.reports",
    "run_audit": "gradleak.audit",
    "measure_utility": "gradleak.evaluation.utility",
    "tune_process": "gradleak.runtime.tuning",
}

renamed.install()  # the module paths release 0.2 moved keep importing, with a warning
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS, renamed.renamed_attribute)

__all__ = [
    "Attack",
    "AttackSettings",
    "Defense",
    "DefenseSettings",
    "GradleakDeprecation",
    "GradleakError",
    "GradleakNotice",
    "Metrics",
    "MissingDependencyError",
    "OptionError",
    "Reconstruction",
    "Record",
    "RunConfig",
    "Update",
    "UpdateMismatchError",
    "__version__",
    "attack",
    "client_update",
    "invert",
    "load_model",
    "load_record",
    "measure_utility",
    "register_attack",
    "register_dataset",
    "register_defense",
    "register_model",
    "replay",
    "run_audit",
    "run_experiment",
    "score",
    "tune_process",
    "write_report",
]
