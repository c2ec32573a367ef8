"""Parts from elsewhere: the classes that other packages declare as entry points of
``gradleak.attacks`` / ``gradleak.defenses``, and the checks that a class registered at run
time passes too (it subclasses the right base and names its settings model).

Nothing here is loaded at ``import gradleak``: a registry calls :func:`discover` the first
time it is consulted (``registry.Registry``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from gradleak.errors import GradleakError

EntryT = TypeVar("EntryT")


class Origin(BaseModel):
    """Where a registered attack or defense comes from; every record names it beside the
    attack and the defenses it ran."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # gradleak's own parts: "gradleak"; a plugin's: its distribution's name; a part registered
    # at run time: the module that defined its class ("__main__" in a notebook).
    package: str
    version: str | None  # the distribution's version; None for a part registered at run time
    source: Literal["built-in", "entry point", "run time"]

    def __str__(self) -> str:
        if self.source == "run time":
            return f"{self.package} (registered at run time)"
        return f"{self.package} {self.version}"


@dataclass(frozen=True)
class Plugin(Generic[EntryT]):
    """What an entry point declares, checked and made an entry of its registry."""

    entry: EntryT
    entry_point: str  # "echo = echo_plugin:EchoAttack", for messages


def resolve(ref: type | str) -> type:
    """A class given as itself or as ``"module:Class"`` (imported now)."""
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def settings_of(
    implementation: object, kind: str, base: type, settings_base: type[BaseModel]
) -> type[BaseModel]:
    """The settings model of ``implementation``, a subclass of ``base`` declared as
    ``class MyAttack(Attack[MySettings])``; a one-line ``GradleakError`` for anything else."""
    if not (isinstance(implementation, type) and issubclass(implementation, base)):
        raise GradleakError(
            f"{implementation!r} is not a subclass of gradleak.{base.__name__}: declare the "
            f"{kind} as class My{base.__name__}({base.__name__}[MySettings])"
        )
    for cls in implementation.__mro__:
        for parent in getattr(cls, "__orig_bases__", ()):
            for argument in typing.get_args(parent):
                if isinstance(argument, type) and issubclass(argument, settings_base):
                    _check_name(argument, kind)
                    return argument
    raise GradleakError(
        f"{kind} class {implementation.__name__} does not name its settings: declare it as "
        f"class {implementation.__name__}({base.__name__}[MySettings]) with MySettings a "
        f"subclass of {settings_base.__name__}"
    )


def _check_name(settings: type[BaseModel], kind: str) -> None:
    field = settings.model_fields.get("name")
    if field is None or not isinstance(field.default, str) or not field.default:
        raise GradleakError(
            f"{kind} settings {settings.__name__} have no name: declare "
            f"name: Literal['my-{kind}'] = 'my-{kind}'"
        )


def discover(
    group: str,
    kind: str,
    make_entry: Callable[[object, Origin], EntryT],
    named: str = "it is named",
) -> tuple[list[Plugin[EntryT]], dict[str, str]]:
    """The installed plugins of entry-point ``group``, each loaded and made an entry by
    ``make_entry`` (the object, its origin; a ``GradleakError`` says why it cannot be one), and,
    by entry-point name, a one-line reason for each one that could not be loaded (its import
    failed, ``make_entry`` refused it, or its name differs from the entry point's: ``named``
    says whose name, "its settings are named")."""
    plugins: list[Plugin[EntryT]] = []
    failed: dict[str, str] = {}
    for entry_point in importlib.metadata.entry_points(group=group):
        dist = entry_point.dist
        package = dist.name if dist is not None else entry_point.module.partition(".")[0]
        version = dist.version if dist is not None else None
        where = f"{kind} plugin '{entry_point.name}' of package {package} {version}"
        origin = Origin(package=package, version=version, source="entry point")
        try:
            entry = make_entry(entry_point.load(), origin)
        except GradleakError as exc:
            failed[entry_point.name] = f"{where} is skipped: {exc}"
            continue
        except Exception as exc:  # a plugin's own bug: one line here, never its traceback
            failed[entry_point.name] = (
                f"{where} is skipped: loading {entry_point.value} raised "
                f"{type(exc).__name__}: {exc}"
            )
            continue
        if entry.name != entry_point.name:
            failed[entry_point.name] = (
                f"{where} is skipped: {named} '{entry.name}': name the entry point "
                f"'{entry.name}' too"
            )
            continue
        plugins.append(Plugin(entry, f"{entry_point.name} = {entry_point.value}"))
    return plugins, failed
