"""An experiment's cells: the product of its axes over its fixed settings, less the excluded
combinations, with the include rules applied as GitHub Actions applies a matrix's ``include``
(a rule whose axis values match existing cells adds its other settings to them; a rule that
matches none is a cell of its own; a file without axes is its include rules' cells). Every
cell is validated as a ``gradleak attack`` run would be, and a problem names the file, the
line and the key that caused it. A run may set options in every cell (``overrides``: the
command line's ``--set KEY=VALUE``), and cells are named by the file's ``cell_name`` where it
has one, else by the values that tell them apart."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradleak.config import RunConfig
from gradleak.config.options import all_options, config_from_options, unknown_name
from gradleak.config.run import path_problem
from gradleak.errors import OptionError
from gradleak.experiments.spec import (
    CELL_NAME,
    OVERRIDE,
    ExperimentError,
    ExperimentFile,
    Location,
    name_templates,
    option_key,
    same_value,
)

PATH_OPTIONS = ("data_dir",)  # options holding a path: relative to the experiment's folder


@dataclass(frozen=True)
class Cell:
    """One run of the grid: its name (the values that set it apart), its options and its
    validated config. ``dropped`` are shared options its attack does not take."""

    name: str
    labels: dict[str, Any]
    options: dict[str, Any]
    config: RunConfig
    dropped: tuple[str, ...] = ()
    sources: dict[str, Location] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> str:
        """The cell's identity as text: what the results store keys it by."""
        return identity_key(self.config)


def identity_key(config: RunConfig) -> str:
    """A config's identity (the settings a result depends on) as canonical JSON."""
    return canonical_json(config.identity())


def canonical_json(value: Any) -> str:
    """``value`` as JSON that equal values always write alike (keys sorted, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass
class _Draft:
    """A cell before validation: each option's value and where in the file it was set."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, Location] = field(default_factory=dict)
    name: tuple[str, Location] | None = None  # an include rule's name template, and its place

    def set(self, key: str, value: Any, source: Location) -> None:
        self.values[key] = value
        self.sources[key] = source


def expand(
    experiment: ExperimentFile,
    data_dir: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> list[Cell]:
    """The experiment's cells in the order of its axes (then its include rules), each
    validated. ``data_dir`` is the data folder of cells that do not set one; ``overrides``
    (option -> value) are set in every cell over the file's values (cells they make the same
    are one cell)."""
    spec = experiment.spec
    drafts = _product(experiment)
    drafts = [d for d in drafts if not any(_matches(d, rule) for rule in _rules(spec.exclude))]
    drafts = _apply_includes(experiment, drafts)
    if not drafts:
        raise experiment.error(("exclude",), "the grid is empty: every cell is excluded")
    for key, value in checked_overrides(overrides or {}).items():
        for draft in drafts:
            draft.set(key, value, (OVERRIDE, key))
    labels = _varying(experiment, drafts)
    cells: list[Cell] = []
    seen: dict[str, str] = {}
    for draft in drafts:
        cell = _validated(experiment, draft, data_dir, labels)
        if cell.key in seen:  # an axis its attack ignores: the same run twice
            continue
        seen[cell.key] = cell.name
        cells.append(cell)
    _check_names_unique(experiment, cells)
    return cells


def checked_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A run's ``--set`` options by their keys; an unknown one is a one-line error."""
    table = all_options()
    checked = {}
    for raw, value in overrides.items():
        key = option_key(raw)
        if key not in table:
            problem = unknown_name(raw, table).replace(f"unknown option '{raw}'", "not an option")
            raise ExperimentError(f"{OVERRIDE} {raw}: {problem}")
        checked[key] = value
    return checked


def _rules(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{option_key(k): v for k, v in rule.items()} for rule in rules]


def _product(experiment: ExperimentFile) -> list[_Draft]:
    """Every combination of the axes' values over the fixed settings (none without axes
    where include rules make the cells)."""
    spec = experiment.spec
    if not spec.axes and spec.include:
        return []
    axes = list(spec.axes.items())
    drafts = []
    for choice in itertools.product(*(range(len(values)) for _, values in axes)):
        draft = _Draft()
        for raw, value in spec.fixed.items():
            draft.set(option_key(raw), value, ("fixed", raw))
        for (raw, values), i in zip(axes, choice, strict=True):
            draft.set(option_key(raw), values[i], ("axes", raw, i))
        drafts.append(draft)
    return drafts


def _varying(experiment: ExperimentFile, drafts: list[_Draft]) -> list[str]:
    """The keys that tell cells apart (axes' and include rules', in the file's order): those
    whose value is not the same in every cell."""
    spec = experiment.spec
    keys = [option_key(k) for k in spec.axes]
    keys += [option_key(k) for rule in spec.include for k in rule if k != CELL_NAME]
    varying = []
    for key in dict.fromkeys(keys):
        values = [d.values.get(key) for d in drafts]
        if any(v is None or not same_value(v, values[0]) for v in values):
            varying.append(key)
    return varying


def _matches(draft: _Draft, rule: dict[str, Any]) -> bool:
    return all(k in draft.values and same_value(draft.values[k], v) for k, v in rule.items())


def _apply_includes(experiment: ExperimentFile, drafts: list[_Draft]) -> list[_Draft]:
    """GitHub Actions' ``include``: a rule extends every cell whose axis values it matches
    (never changing an axis value), and is a new cell where it matches none."""
    axis_keys = {option_key(k) for k in experiment.spec.axes}
    fixed = experiment.spec.fixed
    original = list(drafts)
    for i, raw_rule in enumerate(experiment.spec.include):
        rule = {option_key(raw): (raw, value) for raw, value in raw_rule.items()
                if raw != CELL_NAME}  # fmt: skip
        name = (raw_rule[CELL_NAME], ("include", i, CELL_NAME)) if CELL_NAME in raw_rule else None
        on_axes = {k: v for k, (_, v) in rule.items() if k in axis_keys}
        extended = False
        for draft in original:
            if all(same_value(draft.values[k], v) for k, v in on_axes.items()):
                for key, (raw, value) in rule.items():
                    if key not in axis_keys:
                        draft.set(key, value, ("include", i, raw))
                draft.name = name or draft.name
                extended = True
        if not extended:
            draft = _Draft(name=name)
            for raw, value in fixed.items():
                draft.set(option_key(raw), value, ("fixed", raw))
            for key, (raw, value) in rule.items():
                draft.set(key, value, ("include", i, raw))
            drafts.append(draft)
    return drafts


def _validated(
    experiment: ExperimentFile, draft: _Draft, data_dir: str | None, labels: list[str]
) -> Cell:
    """The draft's config, named by its values of ``labels``, or the located one-line error
    of its first problem."""
    table = all_options()
    attack = str(draft.values.get("attack", "tag"))
    values, dropped = {}, []
    for key, value in draft.values.items():
        owners = table[key].attacks
        shared = draft.sources[key][0] in ("fixed", "axes", OVERRIDE)
        if owners and attack not in owners and shared and _someone_takes(experiment, key):
            dropped.append(key)  # a shared option of the grid's other attacks
            continue
        values[key] = _resolved(experiment, draft, key, value)
    if data_dir is not None and values.get("data_dir") is None:
        values["data_dir"] = data_dir
    try:
        config = config_from_options(values)
    except OptionError as exc:
        key = exc.option if exc.option in draft.sources else None
        location = draft.sources[key] if key else _first_axis(draft)
        raise experiment.error(location, _without_flag(str(exc), key)) from None
    named = {k: draft.values[k] for k in labels if k in draft.values and k not in dropped}
    name = ",".join(f"{key}={_text(value)}" for key, value in named.items()) or "default"
    name = _declared_name(experiment, draft, name)
    return Cell(name, named, values, config, tuple(dropped), dict(draft.sources))


class _Fields(dict):
    """A cell's values for a name template: ``{batch-size}`` and ``{batch_size}`` alike."""

    def __getitem__(self, key: str) -> Any:
        return super().__getitem__(option_key(key))


def _declared_name(experiment: ExperimentFile, draft: _Draft, default: str) -> str:
    """The cell's name from its include rule's template or the file's first ``cell_name``
    rule it matches; ``default`` (its labels) where the file names it by neither."""
    template = draft.name
    if template is None:
        template = next(
            ((name, location) for name, where, location in name_templates(experiment)
             if _matches(draft, {option_key(k): v for k, v in where.items()})),
            None,
        )  # fmt: skip
    if template is None:
        return default
    text, location = template
    try:
        name = text.format_map(_Fields(draft.values))
    except KeyError as exc:
        raise experiment.error(
            location, f"{{{exc.args[0]}}} is not set in cell {default}: name it by another rule"
        ) from None
    except (ValueError, TypeError, IndexError) as exc:
        raise experiment.error(location, f"cannot name cell {default}: {exc}") from None
    if not name.strip() or "/" in name or name.startswith("."):
        raise experiment.error(
            location, f"'{name}' cannot name a cell (a kept folder holds a file of that name)"
        )
    return name


def _someone_takes(experiment: ExperimentFile, key: str) -> bool:
    """Whether some attack the grid names takes option ``key`` (else it is an error to set)."""
    spec = experiment.spec
    named = [v for k, vs in spec.axes.items() if option_key(k) == "attack" for v in vs]
    named += [v for k, v in spec.fixed.items() if option_key(k) == "attack"]
    named += [v for rule in spec.include for k, v in rule.items() if option_key(k) == "attack"]
    return any(str(a) in all_options()[key].attacks for a in named)


def _resolved(experiment: ExperimentFile, draft: _Draft, key: str, value: Any) -> Any:
    """A path option relative to the experiment's folder; an error if it does not exist.
    ``file:`` datasets are resolved the same way."""
    location = draft.sources[key]
    if key in PATH_OPTIONS and value is not None:
        return _existing(experiment, location, str(value))
    if key == "dataset" and str(value).startswith("file:"):
        return "file:" + _existing(experiment, location, str(value)[5:])
    return value


def _existing(experiment: ExperimentFile, location: Location, given: str) -> str:
    """``given`` relative to the folder of the file that declared it, checked to exist; a path
    the system cannot take (a name too long, an unknown ``~user``) is the located error."""
    problem = path_problem(given)
    if problem is not None:
        raise experiment.error(location, problem)
    try:
        path = (experiment.folder_of(location) / Path(given).expanduser()).resolve()
        exists = path.exists()
    except (OSError, RuntimeError, ValueError) as exc:
        raise experiment.error(location, f"not a path here: {exc}") from None
    if not exists:
        raise experiment.error(location, f"{path} does not exist: fix the path")
    return str(path)


def _first_axis(draft: _Draft) -> Location:
    """Where a cell's problem is blamed when no one option is: its first axis value."""
    return next((s for s in draft.sources.values() if s[0] not in ("fixed", OVERRIDE)), ())


def _without_flag(message: str, key: str | None) -> str:
    """The option error without its leading flag, which the location already names."""
    if key is None:
        return message
    flag = "--" + key.replace("_", "-")
    return message.replace(f"invalid {flag}: ", "", 1)


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _check_names_unique(experiment: ExperimentFile, cells: list[Cell]) -> None:
    names: dict[str, Cell] = {}
    for cell in cells:
        if cell.name in names:
            where = (CELL_NAME,) if experiment.spec.cell_name is not None else ("include",)
            raise experiment.error(
                where,
                f"two different cells are both named {cell.name}: name them apart, or give "
                "the include rule a value that tells them apart",
            )
        names[cell.name] = cell
