"""Named parts of one kind and where each comes from.

Parts come in three ways:

* gradleak's own, registered when their registry's module is imported;
* other installed packages', as entry points of the registry's ``group``
  (:mod:`~gradleak.registry.plugins`), loaded once, the first time the registry is consulted. A
  plugin that fails to load is skipped with a one-line ``PluginWarning`` (asking for it by
  name repeats the line); one whose name another part already has is a ``GradleakError``
  every time the registry is consulted, since a record could otherwise credit the wrong code;
* parts registered in the running program (a notebook's), which may replace their own name.

Two shapes share that machinery: a :class:`Registry` holds configurable parts (attacks,
defenses: a settings model and the class it configures), a :class:`Catalog` holds specs (models,
datasets: one object each, read like a mapping of names to specs).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from gradleak.errors import GradleakError, PluginWarning, one_line
from gradleak.registry.plugins import Origin, discover, resolve, settings_of
from gradleak.version import __version__

SettingsT = TypeVar("SettingsT", bound=BaseModel)
SpecT = TypeVar("SpecT")
EntryT = TypeVar("EntryT", bound="Named")
BUILT_IN = Origin(package="gradleak", version=__version__, source="built-in")

# Says what is wrong with a new part's settings beside the registered ones (an option name
# another part uses differently), or None; ``config.options`` installs the attacks' check.
Check = Callable[[type[BaseModel], list["Entry[Any]"]], str | None]


class Named(Protocol):
    """What every registered part has: a name and an origin."""

    origin: Origin

    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class Entry(Generic[SettingsT]):
    """A configurable part: ``settings`` declares its options (its ``name`` field is the tag);
    ``implementation`` is built from them; ``origin`` says which package it came from.

    A built-in part names its implementation as ``"module:Class"``, imported the first time
    it is built: listing the parts and validating their settings import no torch."""

    settings: type[SettingsT]
    implementation_ref: type | str
    origin: Origin

    @property
    def name(self) -> str:
        return self.settings.model_fields["name"].default

    @property
    def implementation(self) -> type:
        return resolve(self.implementation_ref)

    @property
    def description(self) -> str:
        return getattr(self.settings, "description", "") or getattr(
            self.implementation, "description", ""
        )


@dataclass(frozen=True)
class Listed(Generic[SpecT]):
    """A spec in a catalog, with where it came from."""

    spec: SpecT
    origin: Origin

    @property
    def name(self) -> str:
        return self.spec.name  # type: ignore[attr-defined]

    @property
    def description(self) -> str:
        return getattr(self.spec, "description", "")


class Parts(Generic[EntryT]):
    """Parts of one ``kind`` by name; other packages add theirs through the entry points of
    ``group`` (None: no plugins). Subclasses say how an entry point's object becomes an entry
    (:meth:`_from_plugin`) and what a new entry must fit (:meth:`_problem`)."""

    def __init__(self, kind: str, group: str | None = None) -> None:
        self.kind = kind
        self.group = group
        self._entries: dict[str, EntryT] = {}
        self._plugins_loaded = False
        self._failed: dict[str, str] = {}  # plugin name -> why it was skipped
        self._revision = 0
        self._watchers: list[Callable[[], None]] = []

    # --- what subclasses decide ---------------------------------------------------------------

    def _from_plugin(self, loaded: object, origin: Origin) -> EntryT:
        """The entry an entry point's object makes; a ``GradleakError`` says why it cannot."""
        raise NotImplementedError

    def _problem(self, entry: EntryT, others: list[EntryT]) -> str | None:
        """Why ``entry`` cannot join ``others``, or None."""
        return None

    _named = "it is named"  # whose name an entry point must repeat, for messages

    # --- adding and removing parts ------------------------------------------------------------

    def _add_built_in(self, entry: EntryT) -> None:
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} {entry.name!r} is registered twice")
        self._entries[entry.name] = entry
        self._changed()

    def _add_runtime(self, entry: EntryT, rename_hint: str) -> EntryT:
        """Add a part of the running program; the same name again replaces an earlier run-time
        part (a notebook cell run twice), a built-in's or a plugin's name is an error."""
        self._load_plugins()
        existing = self._entries.get(entry.name)
        if existing is not None and existing.origin.source != "run time":
            raise GradleakError(
                f"{self.kind} '{entry.name}' already comes from {existing.origin}: {rename_hint}"
            )
        others = [e for e in self._entries.values() if e.name != entry.name]
        problem = self._problem(entry, others)
        if problem:
            raise GradleakError(f"{self.kind} '{entry.name}' cannot be registered: {problem}")
        self._entries[entry.name] = entry
        self._changed()
        return entry

    def unregister(self, name: str) -> None:
        """Remove a part registered at run time (built-ins and plugins stay)."""
        entry = self.entry(name)
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

    # --- consulting ---------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """A number that changes whenever the set of parts does (for caches built from it)."""
        self._load_plugins()
        return self._revision

    def names(self) -> list[str]:
        self._load_plugins()
        return list(self._entries)

    def entries(self) -> list[EntryT]:
        self._load_plugins()
        return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries

    def entry(self, name: str) -> EntryT:
        """Part ``name``; an unknown name, or a plugin that failed to load, is a one-line
        error that says which names exist (or why the plugin was skipped)."""
        self._load_plugins()
        if name in self._failed:
            raise GradleakError(self._failed[name])
        if name not in self._entries:
            raise GradleakError(
                f"unknown {self.kind} '{one_line(str(name)[:80])}': use one of "
                f"{', '.join(self._entries)}"
            )
        return self._entries[name]

    def failure(self, name: str) -> str | None:
        """Why an installed plugin of this ``name`` was skipped, or None."""
        self._load_plugins()
        return self._failed.get(name)

    def origin(self, name: str) -> Origin:
        """Where part ``name`` comes from (for the record)."""
        return self.entry(name).origin

    # --- plugins ------------------------------------------------------------------------------

    def _reload_plugins(self) -> None:
        """Drop the plugins loaded so far: the next consultation loads them again."""
        if self._plugins_loaded:
            self._entries = {
                n: e for n, e in self._entries.items() if e.origin.source != "entry point"
            }
            self._plugins_loaded = False
            self._failed = {}
            self._changed()

    def _load_plugins(self) -> None:
        """Add the installed plugins, once; a name clash raises (and is raised again on the
        next consultation), a plugin that fails to load is skipped with a warning."""
        if self._plugins_loaded or self.group is None:
            return
        plugins, failed = discover(self.group, self.kind, self._from_plugin, self._named)
        added: dict[str, EntryT] = {}
        for plugin in plugins:
            entry = plugin.entry
            clash = self._entries.get(entry.name) or added.get(entry.name)
            if clash is not None:
                package = entry.origin.package
                raise GradleakError(
                    f"{self.kind} plugin '{plugin.entry_point}' of package {entry.origin} "
                    f"has the name of the {self.kind} from {clash.origin}: rename it in "
                    f"{package}'s entry points or uninstall {package}"
                )
            problem = self._problem(entry, [*self._entries.values(), *added.values()])
            if problem:
                failed[entry.name] = (
                    f"{self.kind} plugin '{entry.name}' of package {entry.origin} is "
                    f"skipped: {problem}"
                )
                continue
            added[entry.name] = entry
        self._entries.update(added)
        self._failed = failed
        self._plugins_loaded = True
        for message in failed.values():
            warnings.warn(message, PluginWarning, stacklevel=3)
        self._changed()

    def _changed(self) -> None:
        self._revision += 1
        for callback in self._watchers:
            callback()


class Registry(Parts[Entry[SettingsT]]):
    """Configurable parts of one ``kind`` ("attack", "defense"): subclasses of ``base`` (a
    class or ``"module:Class"``) configured by subclasses of ``settings_base``."""

    def __init__(
        self,
        kind: str,
        group: str | None = None,
        base: type | str = object,
        settings_base: type[BaseModel] = BaseModel,
        check: Check | None = None,
    ) -> None:
        super().__init__(kind, group)
        self._base = base
        self.settings_base = settings_base
        self._check = check

    @property
    def base(self) -> type:
        """The class every part subclasses (imported when first needed)."""
        return resolve(self._base)

    def set_check(self, check: Check) -> None:
        """Install the check a new part's settings must pass beside the registered ones; the
        layer that builds options from the settings installs it (``config.options``). Plugins
        loaded before it are loaded again, under it, at the next consultation."""
        self._check = check
        self._reload_plugins()

    def register(self, implementation: type | str, settings: type[SettingsT]) -> None:
        """Add one of gradleak's own parts (its class, or ``"module:Class"`` to import when it
        is first built); its name is the default of ``settings.name``."""
        self._add_built_in(Entry(settings, implementation, BUILT_IN))

    def register_runtime(self, implementation: type) -> Entry[SettingsT]:
        """Add a part defined in the running program, declared as
        ``class MyAttack(Attack[MySettings])``. Registering the same name again replaces the
        earlier run-time part (a notebook cell run twice); a built-in's or a plugin's name is
        an error."""
        settings = settings_of(implementation, self.kind, self.base, self.settings_base)
        origin = Origin(package=implementation.__module__, version=None, source="run time")
        hint = f"give {settings.__name__}.name another value"
        return self._add_runtime(Entry(settings, implementation, origin), hint)

    def __getitem__(self, name: str) -> Entry[SettingsT]:
        return self.entry(name)

    def settings(self, name: str | dict[str, Any], **values: Any) -> SettingsT:
        """Validated settings of part ``name`` (or of a mapping holding ``name``); ``values``
        override its defaults."""
        if isinstance(name, dict):
            values = {**name, **values}
            if not isinstance(values.get("name"), str):
                raise GradleakError(f"a {self.kind}'s settings need its name: add name: NAME")
            name = values.pop("name")
        entry = self.entry(name)
        try:
            return entry.settings(name=name, **values)
        except ValidationError as exc:
            raise GradleakError(
                f"bad settings for {self.kind} {name}: {first_error(exc)}"
            ) from None

    def build(self, settings: SettingsT) -> Any:
        """The part that ``settings`` configure (nothing loaded yet)."""
        return self.entry(settings.name).implementation(settings)

    _named = "its settings are named"

    def _from_plugin(self, loaded: object, origin: Origin) -> Entry[SettingsT]:
        settings = settings_of(loaded, self.kind, self.base, self.settings_base)
        return Entry(settings, loaded, origin)  # type: ignore[arg-type]

    def _problem(self, entry: Entry[SettingsT], others: list[Entry[SettingsT]]) -> str | None:
        return self._check(entry.settings, others) if self._check else None


class Catalog(Parts[Listed[SpecT]], Mapping[str, SpecT]):
    """Specs of one ``kind`` ("model", "dataset") by name, each an instance of ``spec_type``
    with a ``name``; read as a mapping of names to specs (``entry`` gives one with its
    origin). An entry point of ``group`` names a spec object."""

    def __init__(self, kind: str, group: str | None, spec_type: type[SpecT]) -> None:
        super().__init__(kind, group)
        self.spec_type = spec_type

    def register(self, spec: SpecT) -> None:
        """Add one of gradleak's own specs."""
        self._add_built_in(Listed(spec, BUILT_IN))

    def register_runtime(self, spec: SpecT, package: str = "__main__") -> Listed[SpecT]:
        """Add a spec made in the running program (``package``: the module that made it);
        the same name again replaces it, a built-in's or a plugin's name is an error."""
        self._check_type(spec)
        origin = Origin(package=package, version=None, source="run time")
        return self._add_runtime(Listed(spec, origin), "give it another name")

    def __getitem__(self, name: str) -> SpecT:
        self._load_plugins()
        return self._entries[name].spec

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name: object) -> bool:
        return Parts.__contains__(self, name)

    def _from_plugin(self, loaded: object, origin: Origin) -> Listed[SpecT]:
        self._check_type(loaded)
        return Listed(loaded, origin)  # type: ignore[arg-type]

    def _check_type(self, spec: object) -> None:
        if not isinstance(spec, self.spec_type):
            raise GradleakError(
                f"{spec!r} is not a gradleak {self.spec_type.__name__}: register a "
                f"{self.spec_type.__name__}(...) for a {self.kind}"
            )


def first_error(exc: ValidationError) -> str:
    """Pydantic's first complaint as ``field: message``, on one line (a field name comes
    from the user's text and may hold a line break)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return one_line(f"{where}: {first['msg']}" if where else first["msg"])
