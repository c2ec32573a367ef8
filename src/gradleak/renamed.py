"""What release 0.2 moved or renamed, kept working until 0.3: an old module path imports the
new module and an old name gives the new object, each with a :class:`GradleakDeprecation` that
says what to use instead. ``docs/renamed.md`` lists them."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

from gradleak.errors import GradleakDeprecation

REMOVED_IN = "0.3"

# old module -> the module that holds it now
MODULES: dict[str, str] = {
    "gradleak.update": "gradleak.api.update",
    "gradleak.extend": "gradleak.api.extend",
    "gradleak.cli_console": "gradleak.cli.console",
    "gradleak.cli_experiments": "gradleak.cli.experiments",
    "gradleak.cli_flower": "gradleak.cli.flower",
    "gradleak.cli_options": "gradleak.cli.parameters",
    "gradleak.options": "gradleak.config.options",
    "gradleak.plugins": "gradleak.registry.plugins",
    "gradleak.recipe": "gradleak.running.recipe",
    "gradleak.runner": "gradleak.running.runner",
    "gradleak.distributed": "gradleak.running.distributed",
    "gradleak.store": "gradleak.running.store",
    "gradleak.record": "gradleak.running.record",
    "gradleak.demo": "gradleak.running.demo",
    "gradleak.devices": "gradleak.runtime.devices",
    "gradleak.environment": "gradleak.runtime.environment",
    "gradleak.global_state": "gradleak.runtime.state",
    "gradleak.progress": "gradleak.runtime.progress",
    "gradleak.metrics": "gradleak.evaluation.metrics",
    "gradleak.utility": "gradleak.evaluation.utility",
    "gradleak.federated.round": "gradleak.defenses.round",
    "gradleak.data.demo": "gradleak.data.builtin",
    "gradleak.models.registry": "gradleak.models.loading",
    "gradleak.attacks.ghost": "gradleak.attacks.optimization.ghost.statistics",
    "gradleak.attacks.ghost_rules": "gradleak.attacks.optimization.ghost.rules",
    "gradleak.attacks.streamed": "gradleak.attacks.optimization.ghost.streamed",
    "gradleak.attacks.low_rank": "gradleak.attacks.optimization.ghost.low_rank",
    "gradleak.attacks.objective": "gradleak.attacks.optimization.matching.objective",
    "gradleak.attacks.distances": "gradleak.attacks.optimization.matching.distances",
    "gradleak.attacks.targets": "gradleak.attacks.optimization.matching.targets",
    "gradleak.attacks.dummy_loss": "gradleak.attacks.optimization.matching.dummy_loss",
    "gradleak.attacks.simulation": "gradleak.attacks.optimization.matching.simulation",
    "gradleak.attacks.candidate_scoring": (
        "gradleak.attacks.optimization.matching.candidate_scoring"
    ),
    "gradleak.attacks.row_scoring": "gradleak.attacks.optimization.matching.row_scoring",
    "gradleak.attacks.discrete": "gradleak.attacks.optimization.discrete.moves",
    "gradleak.attacks.prior": "gradleak.attacks.optimization.discrete.prior",
    "gradleak.attacks.initialization": "gradleak.attacks.optimization.initialization",
}

# module -> old name -> (the module that holds the new one, its new name)
NAMES: dict[str, dict[str, tuple[str, str]]] = {
    "gradleak": {"run": ("gradleak", "attack")},
    "gradleak.api": {"run": ("gradleak.api.runs", "attack")},
    "gradleak.federated.client": {
        "ClientUpdate": ("gradleak.federated.payload", "UpdatePayload"),
    },
    "gradleak.defenses.round": {"client_update": ("gradleak.defenses.round", "defended_update")},
    "gradleak.attacks.adaptive": {
        name: ("gradleak.attacks.optimization.matching.adapted", name)
        for name in ("adapted_distance", "on_kept_coordinates", "sign_distance", "sign_violations")
    },
    "gradleak.models.adapters": {"ROLES": ("gradleak.models.roles", "ROLES")},
    "gradleak.experiments.claims": {
        name: ("gradleak.experiments.claim_files", name) for name in ("ClaimFile", "SECTIONS")
    },
    "gradleak.cli": {
        "print_record": ("gradleak.cli.show", "print_record"),
        "plugins_reported": ("gradleak.cli.attack", "plugins_reported"),
        "regenerate_attack_options": ("gradleak.cli.attack", "regenerate_attack_options"),
        "demo": ("gradleak.cli.main", "demo"),
        **{
            name: ("gradleak.cli.listings", name)
            for name in ("attacks", "defenses", "models", "datasets")
        },
    },
}


def warn(old: str, new: str) -> None:
    """Warn that ``old`` is now ``new``, pointing at the user's line that used the old one."""
    warnings.warn(
        f"{old} is now {new}; the old name goes in gradleak {REMOVED_IN}",
        GradleakDeprecation,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this module and a module's ``__getattr__``
    that asked for an old name (:func:`warnings.warn` itself skips the import machinery's)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if "importlib" in filename and "_bootstrap" in filename:
            frame = frame.f_back  # not counted by warnings.warn
            continue
        if filename != __file__ and frame.f_code.co_name != "__getattr__":
            break
        frame, level = frame.f_back, level + 1
    return level


def renamed_attribute(module: str, name: str) -> Any:
    """The object an old ``name`` of ``module`` stands for, with a warning; AttributeError
    when ``name`` is no old name there (a module's ``__getattr__`` ends with this)."""
    moved = NAMES.get(module, {}).get(name)
    if moved is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    source, new = moved
    warn(f"{module}.{name}", f"{source}.{new}")
    return getattr(importlib.import_module(source), new)


class _MovedModule(importlib.abc.Loader):
    """Loads an old module path as the module that holds it now: the import system returns
    what ``sys.modules`` holds under the old name after ``exec_module``, the new module itself
    (its own ``__spec__`` and ``__name__`` untouched)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def exec_module(self, module: ModuleType) -> None:
        warn(f"module {module.__name__}", self.new)
        sys.modules[module.__name__] = importlib.import_module(self.new)


class _MovedModules(importlib.abc.MetaPathFinder):
    """Finds the old module paths of :data:`MODULES`."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        new = MODULES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedModule(new))


def install() -> None:
    """Make the old module paths importable (once per process)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())
