"""Attacks, defenses, models and datasets defined in the running program (a notebook, a
script): registered here, they are usable by name from ``gradleak.attack`` and
``gradleak.invert``, in configs, and from ``gradleak attack`` in the same process, like the
built-in ones.

An installed package registers its own through entry points instead (``gradleak.attacks``,
``gradleak.defenses``, ``gradleak.models``, ``gradleak.datasets``; see docs/extending.md):
those are found in every process, including a run's worker processes.
"""

from __future__ import annotations

import inspect
from typing import TypeVar

from gradleak.attacks import ATTACKS, Attack
from gradleak.data.specs import DATASETS, DatasetSpec
from gradleak.defenses import DEFENSES, Defense
from gradleak.models.specs import MODELS, ModelSpec

AttackT = TypeVar("AttackT", bound=type[Attack])
DefenseT = TypeVar("DefenseT", bound=type[Defense])


def register_attack(cls: AttackT) -> AttackT:
    """Make an attack class usable under the name its settings declare.

    Registering a class with the same name again replaces it (a notebook cell run twice).
    ``gradleak.attacks.ATTACKS.unregister(name)`` removes it. Its records name its module as
    the package, at no version.

    Args:
        cls: The class, declared as ``class MyAttack(Attack[MySettings])``.

    Returns:
        ``cls`` itself, so that it works as a decorator.

    Raises:
        GradleakError: ``cls`` is no such class, or its name is a built-in's or an installed
            plugin's, or one of its options takes a name another setting already has.
    """
    ATTACKS.register_runtime(cls)
    return cls


def register_defense(cls: DefenseT) -> DefenseT:
    """Make a defense class usable in ``defense="NAME:..."``, with the same rules as
    :func:`register_attack` (``gradleak.defenses.DEFENSES.unregister(name)`` removes it).

    Args:
        cls: The class, declared as ``class MyDefense(UpdateDefense[MySettings])`` (or
            another stage class of ``gradleak.defenses``).

    Returns:
        ``cls`` itself, so that it works as a decorator.

    Raises:
        GradleakError: ``cls`` is no such class, or its name is a built-in's or an installed
            plugin's.
    """
    DEFENSES.register_runtime(cls)
    return cls


def register_model(spec: ModelSpec) -> ModelSpec:
    """Make a model usable by its name (``model="NAME"``), with the same rules as
    :func:`register_attack` (``gradleak.models.specs.MODELS.unregister(name)`` removes it).
    A spec with an ``adapter`` also teaches gradleak its family.

    Args:
        spec: The model's :class:`~gradleak.models.specs.ModelSpec`.

    Returns:
        ``spec`` itself.

    Raises:
        GradleakError: ``spec`` is no ``ModelSpec``, or its name is a built-in's or an
            installed plugin's.
    """
    MODELS.register_runtime(spec, package=_caller_module())
    return spec


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    """Make a dataset usable by its name (``dataset="NAME"``), with the same rules as
    :func:`register_attack` (``gradleak.data.specs.DATASETS.unregister(name)`` removes it).

    Args:
        spec: The dataset's :class:`~gradleak.data.specs.DatasetSpec`; its ``format`` names a
            built-in reader or is a :class:`~gradleak.data.formats.Format` of its own.

    Returns:
        ``spec`` itself.

    Raises:
        GradleakError: ``spec`` is no ``DatasetSpec``, or its name is a built-in's or an
            installed plugin's.
    """
    DATASETS.register_runtime(spec, package=_caller_module())
    return spec


def _caller_module() -> str:
    """The module that called the public function calling this one (a record names it)."""
    frame = inspect.stack()[2]
    return frame.frame.f_globals.get("__name__", "__main__")
