"""Named, configurable parts (attacks, defenses): a name maps to a settings model that declares
the part's options once and to the class that the settings configure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from gradleak.errors import GradleakError

SettingsT = TypeVar("SettingsT", bound=BaseModel)


@dataclass(frozen=True)
class Entry(Generic[SettingsT]):
    """A registered part: ``settings`` declares its options (its ``name`` field is the tag);
    ``implementation`` is built from them."""

    settings: type[SettingsT]
    implementation: type

    @property
    def name(self) -> str:
        return self.settings.model_fields["name"].default

    @property
    def description(self) -> str:
        return getattr(self.settings, "description", "") or getattr(
            self.implementation, "description", ""
        )


class Registry(Generic[SettingsT]):
    """Parts of one ``kind`` ("attack", "defense") by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[SettingsT]] = {}

    def register(self, implementation: type, settings: type[SettingsT]) -> None:
        """Add a part; its name is the default of ``settings.name``."""
        entry = Entry(settings=settings, implementation=implementation)
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} {entry.name!r} is registered twice")
        self._entries[entry.name] = entry

    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[Entry[SettingsT]]:
        return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __getitem__(self, name: str) -> Entry[SettingsT]:
        if name not in self._entries:
            raise GradleakError(
                f"unknown {self.kind} '{name}': use one of {', '.join(self._entries)}"
            )
        return self._entries[name]

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


def first_error(exc: ValidationError) -> str:
    """Pydantic's first complaint as ``field: message``."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]
