"""Named, configurable parts (attacks, defenses): a name maps to a settings model that declares
the part's options once, to the class that the settings configure, and to where it came from.

Parts come in three ways:

* gradleak's own, with :meth:`Registry.register` when the package is imported;
* other installed packages', as entry points of the registry's ``group`` (``plugins``),
  loaded once, the first time the registry is consulted. A plugin that fails to load is
  skipped with a one-line ``PluginWarning`` (asking for it by name repeats the line); one
  whose name another part already has is a ``GradleakError`` every time the registry is
  consulted, since a record could otherwise credit the wrong code;
* parts registered at run time (:meth:`Registry.register_runtime`, behind
  ``gradleak.register_attack``): a notebook's attack.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from gradleak import __version__
from gradleak.errors import GradleakError, PluginWarning
from gradleak.plugins import Origin, discover, settings_of

SettingsT = TypeVar("SettingsT", bound=BaseModel)
BUILT_IN = Origin(package="gradleak", version=__version__, source="built-in")

# Says what is wrong with a new part's settings beside the registered ones (an option name
# another part uses differently), or None; see ``attacks/__init__.py``.
Check = Callable[[type[BaseModel], list["Entry[Any]"]], str | None]


@dataclass(frozen=True)
class Entry(Generic[SettingsT]):
    """A registered part: ``settings`` declares its options (its ``name`` field is the tag);
    ``implementation`` is built from them; ``origin`` says which package it came from."""

    settings: type[SettingsT]
    implementation: type
    origin: Origin

    @property
    def name(self) -> str:
        return self.settings.model_fields["name"].default

    @property
    def description(self) -> str:
        return getattr(self.settings, "description", "") or getattr(
            self.implementation, "description", ""
        )


class Registry(Generic[SettingsT]):
    """Parts of one ``kind`` ("attack", "defense") by name: subclasses of ``base`` configured
    by subclasses of ``settings_base``; other packages add theirs through the entry points of
    ``group`` (None: no plugins)."""

    def __init__(
        self,
        kind: str,
        group: str | None = None,
        base: type = object,
        settings_base: type[BaseModel] = BaseModel,
        check: Check | None = None,
    ) -> None:
        self.kind = kind
        self.group = group
        self.base = base
        self.settings_base = settings_base
        self._check = check
        self._entries: dict[str, Entry[SettingsT]] = {}
        self._plugins_loaded = False
        self._failed: dict[str, str] = {}  # plugin name -> why it was skipped
        self._revision = 0
        self._watchers: list[Callable[[], None]] = []

    # --- adding and removing parts ----------------------------------------------------------

    def register(self, implementation: type, settings: type[SettingsT]) -> None:
        """Add one of gradleak's own parts; its name is the default of ``settings.name``."""
        entry = Entry(settings, implementation, BUILT_IN)
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} {entry.name!r} is registered twice")
        self._entries[entry.name] = entry
        self._changed()

    def register_runtime(self, implementation: type) -> Entry[SettingsT]:
        """Add a part defined in the running program, declared as
        ``class MyAttack(Attack[MySettings])``. Registering the same name again replaces the
        earlier run-time part (a notebook cell run twice); a built-in's or a plugin's name is
        an error."""
        self._load_plugins()
        settings = settings_of(implementation, self.kind, self.base, self.settings_base)
        origin = Origin(package=implementation.__module__, version=None, source="run time")
        entry = Entry(settings, implementation, origin)
        existing = self._entries.get(entry.name)
        if existing is not None and existing.origin.source != "run time":
            raise GradleakError(
                f"{self.kind} '{entry.name}' already comes from {existing.origin}: give "
                f"{settings.__name__}.name another value"
            )
        others = [e for e in self._entries.values() if e.name != entry.name]
        problem = self._check(settings, others) if self._check else None
        if problem:
            raise GradleakError(f"{self.kind} '{entry.name}' cannot be registered: {problem}")
        self._entries[entry.name] = entry
        self._changed()
        return entry

    def unregister(self, name: str) -> None:
        """Remove a part registered at run time (built-ins and plugins stay)."""
        entry = self[name]
        if entry.origin.source != "run time":
            raise GradleakError(
                f"{self.kind} '{name}' comes from {entry.origin}, not from register_"
                f"{self.kind}: only parts registered at run time can be unregistered"
            )
        del self._entries[name]
        self._changed()

    def reset(self) -> None:
        """Forget the plugins and the parts registered at run time: the next consultation
        discovers the installed plugins again (tests that install one use this)."""
        self._entries = {n: e for n, e in self._entries.items() if e.origin.source == "built-in"}
        self._plugins_loaded = False
        self._failed = {}
        self._changed()

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever the set of parts changes (the CLI regenerates its
        options)."""
        self._watchers.append(callback)

    # --- consulting -------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """A number that changes whenever the set of parts does (for caches built from it)."""
        self._load_plugins()
        return self._revision

    def names(self) -> list[str]:
        self._load_plugins()
        return list(self._entries)

    def entries(self) -> list[Entry[SettingsT]]:
        self._load_plugins()
        return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries

    def __getitem__(self, name: str) -> Entry[SettingsT]:
        self._load_plugins()
        if name in self._failed:
            raise GradleakError(self._failed[name])
        if name not in self._entries:
            raise GradleakError(
                f"unknown {self.kind} '{name}': use one of {', '.join(self._entries)}"
            )
        return self._entries[name]

    def origin(self, name: str) -> Origin:
        """Where part ``name`` comes from (for the record)."""
        return self[name].origin

    def settings(self, name: str | dict[str, Any], **values: Any) -> SettingsT:
        """Validated settings of part ``name`` (or of a mapping holding ``name``); ``values``
        override its defaults."""
        if isinstance(name, dict):
            values = {**name, **values}
            name = values.pop("name")
        entry = self[name]
        try:
            return entry.settings(name=name, **values)
        except ValidationError as exc:
            raise GradleakError(
                f"bad settings for {self.kind} {name}: {first_error(exc)}"
            ) from None

    def build(self, settings: SettingsT) -> Any:
        """The part that ``settings`` configure (nothing loaded yet)."""
        return self[settings.name].implementation(settings)

    # --- plugins ----------------------------------------------------------------------------

    def _load_plugins(self) -> None:
        """Add the installed plugins, once; a name clash raises (and is raised again on the
        next consultation), a plugin that fails to load is skipped with a warning."""
        if self._plugins_loaded or self.group is None:
            return
        plugins, failed = discover(self.group, self.kind, self.base, self.settings_base)
        added: dict[str, Entry[SettingsT]] = {}
        for plugin in plugins:
            clash = self._entries.get(plugin.name) or added.get(plugin.name)
            if clash is not None:
                raise GradleakError(
                    f"{self.kind} plugin '{plugin.entry_point}' of package {plugin.origin} "
                    f"has the name of the {self.kind} from {clash.origin}: rename it in "
                    f"{plugin.origin.package}'s entry points or uninstall {plugin.origin.package}"
                )
            entry = Entry(plugin.settings, plugin.implementation, plugin.origin)
            problem = self._check(entry.settings, [*self._entries.values(), *added.values()]) \
                if self._check else None  # fmt: skip
            if problem:
                failed[plugin.name] = (
                    f"{self.kind} plugin '{plugin.name}' of package {plugin.origin} is "
                    f"skipped: {problem}"
                )
                continue
            added[plugin.name] = entry
        self._entries.update(added)
        self._failed = failed
        self._plugins_loaded = True
        for message in failed.values():
            warnings.warn(message, PluginWarning, stacklevel=2)
        self._changed()

    def _changed(self) -> None:
        self._revision += 1
        for callback in self._watchers:
            callback()


def first_error(exc: ValidationError) -> str:
    """Pydantic's first complaint as ``field: message``."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]
