"""An experiment's cells: the product of its axes over its fixed settings, less the excluded
combinations, with the include rules applied as GitHub Actions applies a matrix's ``include``
(a rule whose axis values match existing cells adds its other settings to them; a rule that
matches none is a cell of its own). Every cell is validated as a ``gradleak attack`` run
would be, and a problem names the file, the line and the key that caused it."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradleak.config import RunConfig
from gradleak.errors import OptionError
from gradleak.experiments.spec import ExperimentFile, Location, option_key, same_value
from gradleak.options import all_options, config_from_options

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

    def set(self, key: str, value: Any, source: Location) -> None:
        self.values[key] = value
        self.sources[key] = source


def expand(experiment: ExperimentFile, data_dir: str | None = None) -> list[Cell]:
    """The experiment's cells in the order of its axes (then its include rules), each
    validated. ``data_dir`` is the data folder of cells that do not set one."""
    spec = experiment.spec
    drafts = _product(experiment)
    drafts = [d for d in drafts if not any(_matches(d, rule) for rule in _rules(spec.exclude))]
    drafts = _apply_includes(experiment, drafts)
    if not drafts:
        raise experiment.error(("exclude",), "the grid is empty: every cell is excluded")
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


def named_cells(named: list[tuple[str, dict[str, Any]]]) -> list[Cell]:
    """Cells made in code rather than declared in a file (the benchmark suites), each
    validated as ``gradleak attack`` validates its options and labelled, as a grid's cells
    are, by the options whose values differ between them."""
    keys = dict.fromkeys(k for _, options in named for k in options if k != "data_dir")
    first = named[0][1] if named else {}
    varying = [k for k in keys if any(_differs(o.get(k), first.get(k)) for _, o in named)]
    return [
        Cell(
            name,
            {k: options[k] for k in varying if k in options},
            dict(options),
            config_from_options(options),
        )  # fmt: skip
        for name, options in named
    ]


def _differs(a: Any, b: Any) -> bool:
    return (a is not None or b is not None) and not same_value(a, b)


def _rules(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{option_key(k): v for k, v in rule.items()} for rule in rules]


def _product(experiment: ExperimentFile) -> list[_Draft]:
    """Every combination of the axes' values over the fixed settings."""
    spec = experiment.spec
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
    keys += [option_key(k) for rule in spec.include for k in rule]
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
        rule = {option_key(raw): (raw, value) for raw, value in raw_rule.items()}
        on_axes = {k: v for k, (_, v) in rule.items() if k in axis_keys}
        extended = False
        for draft in original:
            if all(same_value(draft.values[k], v) for k, v in on_axes.items()):
                for key, (raw, value) in rule.items():
                    if key not in axis_keys:
                        draft.set(key, value, ("include", i, raw))
                extended = True
        if not extended:
            draft = _Draft()
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
        shared = draft.sources[key][0] in ("fixed", "axes")
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
    return Cell(name, named, values, config, tuple(dropped), dict(draft.sources))


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
    folder = experiment.path.parent
    if key in PATH_OPTIONS and value is not None:
        path = (folder / Path(str(value)).expanduser()).resolve()
        if not path.exists():
            raise experiment.error(draft.sources[key], f"{path} does not exist: fix the path")
        return str(path)
    if key == "dataset" and str(value).startswith("file:"):
        path = (folder / Path(str(value)[5:]).expanduser()).resolve()
        if not path.exists():
            raise experiment.error(draft.sources[key], f"{path} does not exist: fix the path")
        return f"file:{path}"
    return value


def _first_axis(draft: _Draft) -> Location:
    """Where a cell's problem is blamed when no one option is: its first axis value."""
    return next((s for s in draft.sources.values() if s[0] != "fixed"), ())


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
            raise experiment.error(
                ("include",),
                f"two different cells are both named {cell.name}: give the include rule a "
                "value that tells them apart",
            )
        names[cell.name] = cell
