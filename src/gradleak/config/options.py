"""Flat option names for the config models: what ``gradleak attack`` accepts on the command
line and what configuration files may set, generated from the fields of ``RunConfig`` and of
every registered attack's settings, never declared by hand.

An option is a leaf field. Its name is the field's name with dashes (``batch_size`` ->
``--batch-size``) unless the field names another in ``json_schema_extra={"option": ...}``;
fields marked ``{"cli": False}`` are fixed by code. Attack options belong to the attacks whose
settings declare them: giving one to another attack is an error that names its attacks.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from gradleak.attacks.registry import ATTACKS
from gradleak.config.fine_tuning import UtilitySettings
from gradleak.config.run import RunConfig, Scenario
from gradleak.defenses import format_defenses
from gradleak.errors import GradleakError, OptionError
from gradleak.registry import Entry

SCENARIO_PANEL = "Scenario"
RUN_PANEL = "Run"
UTILITY_PANEL = "Fine-tuning"
DEFAULT_ATTACK = "tag"
# The keyword arguments of gradleak.run (and options of gradleak attack) that are not options
# of the config: they do not change the result.
RUN_KEYWORDS = (
    "out", "progress", "workers", "threads", "device", "stack", "backend", "ray_address",
)  # fmt: skip


@dataclass(frozen=True)
class Option:
    """One option: its flag, where its value goes in the config, and how to read it."""

    flag: str  # "--attack-lr"
    path: tuple[str, ...]  # ("attack", "lr")
    kind: type  # int | float | str | bool: the command line's type
    help: str
    panel: str
    default: Any = None  # the scenario's default (an attack's: see attack_defaults)
    attacks: tuple[str, ...] = ()  # attack options: the attacks whose settings declare it
    enables: bool = False  # giving it creates its optional parent (--lora-rank: LoRA)

    @property
    def key(self) -> str:
        """The option as a Python identifier / config-file key (``attack_lr``)."""
        return self.flag.removeprefix("--").replace("-", "_")


def _leaf_kind(annotation: Any) -> type:
    """The command line's type of a field: optional and literal types reduced to their base."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _leaf_kind(kinds[0])
    if origin is Literal:
        return type(typing.get_args(annotation)[0])
    if origin in (tuple, list):
        return str  # LoRA roles "qkv", defenses "noise:sigma=0.1"
    return annotation if annotation in (int, float, str, bool) else str


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _extra(info: FieldInfo) -> dict[str, Any]:
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _walk(
    model: type[BaseModel], path: tuple[str, ...], instance: Any
) -> Iterator[tuple[tuple[str, ...], FieldInfo, Any]]:
    """Every leaf field of ``model`` with its path and its default (from ``instance``)."""
    for name, info in model.model_fields.items():
        if _extra(info).get("cli") is False or name == "name":
            continue
        value = getattr(instance, name, None) if instance is not None else None
        nested = _nested_model(info.annotation)
        if nested is not None and not _extra(info).get("option"):
            yield from _walk(nested, (*path, name), value if value is not None else nested())
        else:
            yield (*path, name), info, value


def _option(path, info, default, panel: str, attacks: tuple[str, ...] = ()) -> Option:
    extra = _extra(info)
    if isinstance(default, tuple) and default and isinstance(default[0], BaseModel):
        default = format_defenses(default)
    elif isinstance(default, tuple):
        default = "".join(map(str, default))
    return Option(
        flag=extra.get("option") or "--" + path[-1].replace("_", "-"),
        path=path,
        kind=_leaf_kind(info.annotation),
        help=info.description or "",
        panel=panel,
        default=default,
        attacks=attacks,
        enables=bool(extra.get("enables")),
    )


@cache
def scenario_options() -> tuple[Option, ...]:
    """The scenario's options, then the run's seed."""
    options = [
        _option(path, info, default, SCENARIO_PANEL)
        for path, info, default in _walk(Scenario, ("scenario",), Scenario())
    ]
    seed = RunConfig.model_fields["seed"]
    options.append(_option(("seed",), seed, seed.default, RUN_PANEL))
    return tuple(options)


@cache
def utility_options() -> tuple[Option, ...]:
    """The options of ``gradleak utility``'s fine-tuning (``utility.UtilitySettings``)."""
    return tuple(
        _option(path, info, default, UTILITY_PANEL)
        for path, info, default in _walk(UtilitySettings, ("utility",), UtilitySettings())
    )


def attack_panel(attacks: tuple[str, ...]) -> str:
    return f"Attack options ({', '.join(attacks)})"


def attack_options() -> tuple[Option, ...]:
    """``--attack`` and every registered attack's options, each once, with the attacks that
    declare it (rebuilt when an attack is registered)."""
    return _attack_options(ATTACKS.revision)


@lru_cache(maxsize=1)
def _attack_options(revision: int) -> tuple[Option, ...]:
    owners: dict[str, list[str]] = {}
    first: dict[str, Option] = {}
    for entry in ATTACKS.entries():
        for option in _declared_options(entry.settings):
            if option.flag in first and first[option.flag].path != option.path:
                raise TypeError(f"{option.flag} names two different attack settings")
            first.setdefault(option.flag, option)
            owners.setdefault(option.flag, []).append(entry.name)
    chooser = Option(
        flag="--attack",
        path=("attack", "name"),
        kind=str,
        help="the attack: " + ", ".join(ATTACKS.names()) + " (see `gradleak attacks`)",
        panel="Attack",
        default=DEFAULT_ATTACK,
    )
    options = [chooser]
    for flag, option in first.items():
        attacks = tuple(owners[flag])
        options.append(
            Option(**{**option.__dict__, "attacks": attacks, "panel": attack_panel(attacks)})
        )
    return tuple(options)


def _declared_options(settings: type[BaseModel]) -> list[Option]:
    """The options one attack's settings model declares."""
    return [_option(path, info, None, "") for path, info, _ in _walk(settings, ("attack",), None)]


def option_conflict(settings: type[BaseModel], others: list[type[BaseModel]]) -> str | None:
    """Why a new attack's ``settings`` cannot join the registered attacks' (``others``): one
    of its options would take a scenario or run option's flag, or another attack's flag for a
    different setting. None when it fits."""
    taken = {o.flag for o in scenario_options()} | {f"--{k}" for k in ("attack", *RUN_KEYWORDS)}
    theirs = {o.flag: o.path for other in others for o in _declared_options(other)}
    for option in _declared_options(settings):
        field = option.path[-1]
        if option.flag in taken or theirs.get(option.flag, option.path) != option.path:
            return (
                f"its setting {field} would take the option {option.flag}, which another "
                f"setting has: declare it as Field(..., json_schema_extra={{'option': "
                f"'--{settings.model_fields['name'].default}-{field.replace('_', '-')}'}})"
            )
    return None


def _fits_beside(settings: type[BaseModel], registered: list[Entry[Any]]) -> str | None:
    """The attacks registry's check of a new attack: its options must fit beside the others'."""
    return option_conflict(settings, [entry.settings for entry in registered])


ATTACKS.set_check(_fits_beside)


def all_options() -> dict[str, Option]:
    """Every option by key (rebuilt when an attack is registered)."""
    return _all_options(ATTACKS.revision)


@lru_cache(maxsize=1)
def _all_options(revision: int) -> dict[str, Option]:
    """Every option by key; a flag declared twice is a programming error."""
    table: dict[str, Option] = {}
    for option in (*scenario_options(), *attack_options()):
        if option.key in table:
            raise TypeError(f"{option.flag} is declared twice ({table[option.key].path})")
        table[option.key] = option
    return table


def attack_defaults(name: str) -> dict[str, Any]:
    """Attack ``name``'s default for each of its options, by key."""
    settings = ATTACKS.settings(name)
    return {
        option.key: _get(settings, option.path[1:])
        for option in attack_options()
        if name in option.attacks
    }


def config_from_options(values: Mapping[str, Any]) -> RunConfig:
    """The config that flat ``values`` describe (keys: option names, with dashes or
    underscores, leading dashes optional; None: not given). Options another attack owns, an
    unknown option or an invalid value raise ``OptionError`` (a ``GradleakError``) with one
    line."""
    table = all_options()
    given: dict[str, Any] = {}
    for raw, value in values.items():
        key = raw.lstrip("-").replace("-", "_")
        if key not in table:
            raise OptionError(_unknown(raw, table), option=key)
        if value is not None:
            given[key] = value
    attack = str(given.get("attack", DEFAULT_ATTACK))
    try:
        ATTACKS[attack]
    except GradleakError as exc:  # unknown, or a plugin that failed to load: says which
        raise OptionError(str(exc), option="attack") from None
    nested: dict[str, Any] = {}
    for key, value in given.items():
        option = table[key]
        if option.attacks and attack not in option.attacks:
            owners = ", ".join(option.attacks)
            raise OptionError(
                f"{option.flag} is an option of {owners}, not of {attack}: drop it or choose "
                f"one of those attacks",
                option=key,
            )
        _set(nested, option.path, value)
    _check_enabled(given, table)
    attack_fields = nested.pop("attack", {})
    try:
        nested["attack"] = ATTACKS[attack].settings(**attack_fields)
    except ValidationError as exc:
        raise _option_error(exc, table, ("attack",)) from None
    try:
        return RunConfig.model_validate(nested)
    except ValidationError as exc:
        raise _option_error(exc, table) from None


def options_of(config: RunConfig) -> dict[str, Any]:
    """The flat options that give ``config`` back through ``config_from_options``."""
    values: dict[str, Any] = {}
    for option in all_options().values():
        if option.attacks and config.attack.name not in option.attacks:
            continue
        value = _get(config, option.path)
        if option.path == ("scenario", "defenses"):
            value = format_defenses(config.scenario.defenses)
        elif isinstance(value, tuple):
            value = "".join(value)
        if value is not None:
            values[option.key] = value
    return values


def _check_enabled(given: dict[str, Any], table: dict[str, Option]) -> None:
    """An option of an optional part (--lora-alpha) needs the option that enables it."""
    for key in given:
        parent = table[key].path[:-1]
        enabler = next((o for o in table.values() if o.enables and o.path[:-1] == parent), None)
        if enabler is not None and enabler.key not in given:
            raise OptionError(f"{table[key].flag} needs {enabler.flag}", option=key)


def _set(target: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value


def _get(source: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        source = getattr(source, part, None)
    return source


def _unknown(raw: str, table: dict[str, Option], command: str = "attack") -> str:
    flag = "--" + raw.lstrip("-").replace("_", "-")
    close = difflib.get_close_matches(flag, [o.flag for o in table.values()], n=1)
    hint = f": did you mean {close[0]}?" if close else f": see gradleak {command} --help"
    return f"unknown option {flag}{hint}"


def unknown_name(name: str, valid: Iterable[str], what: str = "option") -> str:
    """The one-line error for a keyword argument that is not an option: it names the closest
    valid ones (the Python spelling of ``_unknown``'s command-line message)."""
    close = difflib.get_close_matches(name, list(valid), n=3, cutoff=0.6)
    if not close:
        return f"unknown {what} '{name}': see gradleak attack --help for the option names"
    return f"unknown {what} '{name}': did you mean {' or '.join(repr(c) for c in close)}?"


def _option_error(
    exc: ValidationError, table: dict[str, Option], prefix: tuple[str, ...] = ()
) -> OptionError:
    """Pydantic's first complaint, naming the option rather than the config path."""
    first = exc.errors()[0]
    path = prefix + tuple(str(p) for p in first["loc"])
    by_path = {o.path: o for o in table.values()}
    where = next((by_path[path[:n]] for n in range(len(path), 0, -1) if path[:n] in by_path), None)
    name = where.flag if where else ".".join(path) or "settings"
    message = first["msg"].removeprefix("Value error, ")
    return OptionError(f"invalid {name}: {message}", option=where.key if where else None)


def utility_from_options(values: Mapping[str, Any]) -> tuple[RunConfig, UtilitySettings]:
    """``gradleak utility``'s flat options as the scenario's config and the fine-tuning's
    settings (the same one-line errors as ``config_from_options``)."""
    fine_tuning = {o.key: o for o in utility_options()}
    allowed = fine_tuning | {o.key: o for o in scenario_options()}
    given = {k.lstrip("-").replace("-", "_"): v for k, v in values.items() if v is not None}
    for key in given:
        if key not in allowed:
            raise OptionError(_unknown(key, allowed, "utility"))
    utility = utility_settings({k: v for k, v in given.items() if k in fine_tuning})
    config = config_from_options({k: v for k, v in given.items() if k not in fine_tuning})
    return config, utility


def utility_settings(values: Mapping[str, Any]) -> UtilitySettings:
    """The fine-tuning's settings from ``gradleak utility``'s option names (dashes or
    underscores), with the same one-line errors as ``config_from_options``."""
    fine_tuning = {o.key: o for o in utility_options()}
    given = {k.lstrip("-").replace("-", "_"): v for k, v in values.items() if v is not None}
    for key in given:
        if key not in fine_tuning:
            raise OptionError(_unknown(key, fine_tuning, "utility"), option=key)
    try:
        return UtilitySettings(**{fine_tuning[k].path[-1]: v for k, v in given.items()})
    except ValidationError as exc:
        raise _option_error(exc, fine_tuning, ("utility",)) from None
