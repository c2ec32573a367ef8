"""Attacks and defenses defined in the running program (a notebook, a script): registered
here, they are usable by name from ``gradleak.run`` and ``gradleak.invert``, in configs, and
from ``gradleak attack`` in the same process, like the built-in ones.

An installed package registers its own through entry points instead (``gradleak.attacks`` /
``gradleak.defenses``; see docs/extending.md): those are found in every process, including a
run's worker processes.
"""

from __future__ import annotations

from typing import TypeVar

from gradleak.attacks import ATTACKS, Attack
from gradleak.defenses import DEFENSES, Defense

AttackT = TypeVar("AttackT", bound=type[Attack])
DefenseT = TypeVar("DefenseT", bound=type[Defense])


def register_attack(cls: AttackT) -> AttackT:
    """Make attack class ``cls``, declared as ``class MyAttack(Attack[MySettings])``, usable
    under the name its settings declare; returns ``cls`` (so it works as a decorator).

    Registering a class with the same name again replaces it (a notebook cell run twice); a
    built-in's or an installed plugin's name, or an option name that another setting already
    has, is a ``GradleakError``. ``gradleak.attacks.ATTACKS.unregister(name)`` removes it. Its
    records name its module as the package, at no version."""
    ATTACKS.register_runtime(cls)
    return cls


def register_defense(cls: DefenseT) -> DefenseT:
    """Make defense class ``cls``, declared as ``class MyDefense(UpdateDefense[MySettings])``
    (or another stage class of ``gradleak.defenses``), usable in ``defense="NAME:..."``; the
    same rules as :func:`register_attack` (``gradleak.defenses.DEFENSES.unregister(name)``
    removes it)."""
    DEFENSES.register_runtime(cls)
    return cls
