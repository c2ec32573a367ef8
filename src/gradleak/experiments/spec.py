"""An experiment file: fixed settings, axes and include/exclude rules, read from YAML with
the line of every key kept, so that each problem is reported as ``file:line: key: problem``.

The shape (keys are ``gradleak attack`` option names, with dashes or underscores)::

    name: lamp-table1            # optional; default: the file's stem
    fixed: {model: minilm, n_inputs: 5}
    axes:
      attack: [tag, lamp-cos]
      dataset: [cola, sst2]
    exclude: [{attack: tag, dataset: sst2}]
    include: [{attack: dager, dataset: cola}]
    utility: {rounds: 3, clients: 4}   # optional: each cell's scenario fine-tuned and scored
    cell_name: "{attack}-{dataset}"    # optional: the cells' names (default: their labels)
    kept: kept/lamp-table1             # optional: a folder of finished inputs kept as text
    extends: base.yaml                 # optional: start from another file's declaration

``extends`` reads another experiment file (relative to this one) and lays this file's keys
over it: an option set here in ``fixed`` or ``axes`` replaces the base's setting of it (fixed
or axis), ``include`` and ``exclude`` rules add to the base's, and ``description``,
``published``, ``utility`` and ``cell_name`` are the base's unless set here (``name`` and
``kept`` are never inherited). One grid at two sizes is one file and a few lines that extend
it. Every problem is still located in the file that declared the key.

``cell_name`` is a template of option fields (``str.format``: ``"{attack}-B{batch_size}"``,
``"lr{lr:g}"``), or a list of ``{where: {...}, name: TEMPLATE}`` rules of which the first whose
``where`` values a cell has names it (a rule without ``where`` names every other cell); an
include rule's own ``cell_name`` names the cells it makes or extends. Names must be unique,
and make file names (a kept folder holds one file per cell).

Every YAML file is read within bounds (:mod:`gradleak.experiments.yaml_files`). A grid holds at
most :data:`MAX_CELLS` cells.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gradleak.config.fine_tuning import UtilitySettings
from gradleak.config.options import all_options, unknown_name, utility_settings
from gradleak.errors import OptionError, one_line
from gradleak.experiments.yaml_files import (
    ExperimentError,
    Location,
    located,
    read_yaml,
    validated,
)

Places = dict[Location, tuple[Path, int]]  # each key's file and line (a base's keys: the base's)
CELL_NAME = "cell_name"  # the key of an include rule that is a name, not an option
INHERITED = ("description", "published", "utility", CELL_NAME)  # a base's, unless set here
MAX_CELLS = 100_000  # an axes' product (a grid a machine could run is far smaller)
MAX_NAME_CHARS = 100  # a name becomes a folder's or a file's: under any file system's limit


def check_folder_name(value: str | None) -> str | None:
    """A name that names a folder or file beside others (``runs/NAME``, ``runs/audit-NAME``):
    no path separator, no leading dot, nothing a terminal or a file system chokes on. The one
    rule for every name a file declares (experiments, audits)."""
    if value is None:
        return value
    if (
        not value.strip()
        or value != value.strip()
        or value.startswith(".")
        or any(c in value for c in "/\\")
        or one_line(value) != value
        or len(value) > MAX_NAME_CHARS
    ):
        raise ValueError(
            f"{value[:MAX_NAME_CHARS]!r} cannot name a folder: use letters, digits, - and _ "
            f"(at most {MAX_NAME_CHARS} characters)"
        )
    return value


class NameRule(BaseModel):
    """One rule of ``cell_name``: the name of the cells that have the ``where`` values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    where: dict[str, Any] = Field(
        default_factory=dict, description="option values a cell must have (none: every cell)"
    )
    name: str = Field(description="the cells' name: text with {option} fields (str.format)")


class ExperimentSpec(BaseModel):
    """What an experiment file declares (before its cells are expanded and validated)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, description="the experiment's name (default: the file's stem)")
    description: str = Field("", description="what the experiment measures, for its report")
    fixed: dict[str, Any] = Field(default_factory=dict, description="options every cell shares")
    axes: dict[str, list[Any]] = Field(
        default_factory=dict, description="options that vary: the grid is their product"
    )
    include: list[dict[str, Any]] = Field(
        default_factory=list, description="cells to extend or add (GitHub Actions' rules)"
    )
    exclude: list[dict[str, Any]] = Field(
        default_factory=list, description="partial cells to leave out of the product"
    )
    published: str | None = Field(
        None, description="a file of the published figures to compare with (beside this one)"
    )
    utility: dict[str, Any] | None = Field(
        None,
        description="also measure what each cell's protocol and defenses cost the model: "
        "`gradleak utility`'s fine-tuning options ({} takes their defaults)",
    )
    extends: str | None = Field(
        None, description="an experiment file (beside this one) whose declaration this one extends"
    )
    cell_name: str | list[NameRule] | None = Field(
        None,
        description="the cells' names: a template of {option} fields, or {where:, name:} rules "
        "(the first that matches names a cell); default: the values that tell cells apart",
    )
    kept: str | None = Field(
        None,
        description="a folder (beside this file) of the cells' finished inputs kept as text, "
        "CELL.json.partial.jsonl each: a run takes them in first; `gradleak run --keep` "
        "writes them",
    )

    _name_is_a_folder_name = field_validator("name")(check_folder_name)


class ExperimentFile:
    """A parsed experiment file: its declaration (a base's it extends laid under it), the
    file and line of each key, and the text of every file it was read from."""

    def __init__(
        self,
        path: Path,
        spec: ExperimentSpec,
        places: Places,
        texts: tuple[tuple[Path, str], ...] = (),
    ) -> None:
        self.path, self.spec, self.places = path, spec, places
        self.texts = texts or ((path, path.read_text(encoding="utf-8")),)

    @property
    def name(self) -> str:
        return self.spec.name or self.path.stem

    @property
    def text(self) -> str:
        """The file as written, followed by each file it extends (what a report shows)."""
        own, *bases = self.texts
        parts = [own[1].rstrip("\n")]
        parts += [f"# --- extended: {path} ---\n{text.rstrip()}" for path, text in bases]
        return "\n\n".join(parts) + "\n"

    @property
    def kept(self) -> Path | None:
        """The folder of the cells' kept inputs, when the file names one."""
        if self.spec.kept is None:
            return None
        return self.resolved(("kept",), self.spec.kept)

    def resolved(self, location: Location, given: str) -> Path:
        """The path ``given`` at ``location`` (``~`` expanded, relative to its file), or the
        located error of a path the system cannot take (``~nobody``, a NUL byte)."""
        try:
            path = self.places.get(location, (self.path, 0))[0].parent / Path(given).expanduser()
            return path.resolve()
        except (OSError, RuntimeError, ValueError) as exc:
            raise self.error(location, f"not a path here: {exc}") from None

    def lines_of(self, path: Path) -> dict[Location, int]:
        """The line of each key that ``path`` (this file or a base) declared."""
        return {loc: line for loc, (where, line) in self.places.items() if where == path}

    def folder_of(self, location: Location) -> Path:
        """The folder a relative path at ``location`` is relative to: its file's."""
        if location and location[0] == OVERRIDE:
            return Path.cwd()
        return self.places.get(location, (self.path, 0))[0].parent

    def error(self, location: Location, problem: str) -> ExperimentError:
        """``file:line: key: problem`` for the key at ``location`` (or its nearest parent), in
        the file that declared it; ``--set KEY: problem`` for a run's override."""
        if location and location[0] == OVERRIDE:
            return ExperimentError(f"{OVERRIDE} {location[1]}: {problem}")
        for cut in range(len(location), 0, -1):
            if location[:cut] in self.places:
                path, _ = self.places[location[:cut]]
                return located(path, self.lines_of(path), location, problem)
        return located(self.path, {}, location, problem)


OVERRIDE = "--set"  # the source of an option a run sets in every cell (``expand``'s overrides)


def read_experiment(path: str | Path, _extending: tuple[Path, ...] = ()) -> ExperimentFile:
    """Read and check an experiment file's shape and option names, and those of the files it
    extends (the cells' values are checked when the grid is expanded:
    ``gradleak.experiments.grid``)."""
    path = Path(path)
    data, lines = read_yaml(path, "experiment file")
    if not isinstance(data, dict):
        raise ExperimentError(f"{path}: an experiment file is a mapping with fixed: and axes:")
    spec = validated(ExperimentSpec, data, path, lines)
    places = {location: (path, line) for location, line in lines.items()}
    experiment = ExperimentFile(path, spec, places)
    if spec.extends is not None:
        experiment = _extended(experiment, _base(experiment, (*_extending, path.resolve())))
    _check_option_names(experiment)
    _check_cell_names(experiment)
    utility_of(experiment)
    if experiment.spec.published is not None:
        published = experiment.folder_of(("published",)) / experiment.spec.published
        try:
            found = published.resolve().is_file()
        except (OSError, ValueError):  # a name too long, a NUL byte
            found = False
        if not found:
            raise experiment.error(("published",), f"{published} does not exist: fix the path")
    _check_kept(experiment)
    _check_grid_size(experiment)
    return experiment


def _check_grid_size(experiment: ExperimentFile) -> None:
    """The axes' product is at most :data:`MAX_CELLS` (counted before any cell is made)."""
    cells = 1
    for raw, values in experiment.spec.axes.items():
        cells *= max(1, len(values))
        if cells > MAX_CELLS:
            raise experiment.error(
                ("axes", raw),
                f"the axes make over {MAX_CELLS:,} cells: split the grid into several files",
            )


def _base(experiment: ExperimentFile, extending: tuple[Path, ...]) -> ExperimentFile:
    """The file ``experiment`` extends, read and checked."""
    assert experiment.spec.extends is not None
    base = experiment.resolved(("extends",), experiment.spec.extends)
    if base in extending:
        chain = " -> ".join(p.name for p in (*extending, base))
        raise experiment.error(("extends",), f"the files extend each other: {chain}")
    try:
        found = base.is_file()
    except OSError:  # a name too long
        found = False
    if not found:
        raise experiment.error(("extends",), f"{base} does not exist: fix the path")
    return read_experiment(base, extending)


def _extended(own: ExperimentFile, base: ExperimentFile) -> ExperimentFile:
    """``own``'s keys laid over ``base``'s declaration (see the module's docstring)."""
    spec, given = own.spec, own.spec.model_fields_set
    replaced = _keys(spec.fixed) | _keys(spec.axes)
    places: Places = {}
    for location, place in base.places.items():
        section = location[0]
        if section in ("fixed", "axes"):
            if len(location) > 1 and option_key(str(location[1])) in replaced:
                continue
        elif section not in ("include", "exclude") and (
            section not in INHERITED or section in given
        ):
            continue
        places[location] = place
    shift = {"include": len(base.spec.include), "exclude": len(base.spec.exclude)}
    for location, place in own.places.items():
        if location[0] in shift and len(location) > 1:
            location = (location[0], int(location[1]) + shift[str(location[0])], *location[2:])
        places[location] = place
    inherited = {key: getattr(base.spec, key) for key in ("description", "utility", CELL_NAME)
                 if key not in given}  # fmt: skip
    if "published" not in given and base.spec.published is not None:
        inherited["published"] = str(base.folder_of(("published",)) / base.spec.published)
    merged = spec.model_copy(
        update={
            **inherited,
            "fixed": _laid_over(base.spec.fixed, spec.fixed, _keys(spec.axes)),
            "axes": _laid_over(base.spec.axes, spec.axes, _keys(spec.fixed)),
            "include": [*base.spec.include, *spec.include],
            "exclude": [*base.spec.exclude, *spec.exclude],
        }
    )
    return ExperimentFile(own.path, merged, places, (*own.texts, *base.texts))


def _keys(mapping: dict[str, Any]) -> set[str]:
    return {option_key(k) for k in mapping}


def _laid_over(base: dict[str, Any], own: dict[str, Any], dropped: set[str]) -> dict[str, Any]:
    """The base's settings in their order, each replaced by ``own``'s of the same option and
    left out where ``dropped`` (set in the other section here), then ``own``'s new ones."""
    mine = {option_key(k): (k, v) for k, v in own.items()}
    merged: dict[str, Any] = {}
    for raw, value in base.items():
        key = option_key(raw)
        if key in dropped:
            continue
        raw, value = mine.pop(key, (raw, value))
        merged[raw] = value
    merged.update(dict(mine.values()))
    return merged


def _check_kept(experiment: ExperimentFile) -> None:
    """``kept:`` names a folder, or one a ``--keep`` run can make beside existing ones."""
    folder = experiment.kept
    if folder is None:
        return
    try:
        exists, is_dir, parent = folder.exists(), folder.is_dir(), folder.parent.is_dir()
    except OSError as exc:  # a name too long
        raise experiment.error(("kept",), f"not a folder here: {exc.strerror}") from None
    if exists and not is_dir:
        raise experiment.error(("kept",), f"{folder} is a file: name a folder")
    if not exists and not parent:
        raise experiment.error(("kept",), f"{folder.parent} does not exist: fix the path")


def utility_of(experiment: ExperimentFile) -> UtilitySettings | None:
    """The fine-tuning that measures utility, when the file asks for one (validated)."""
    path = experiment.places.get(("utility",), (experiment.path, 0))[0]
    return utility_at(path, experiment.lines_of(path), experiment.spec.utility)


def utility_at(
    path: Path, lines: dict[Location, int], given: dict[str, Any] | None
) -> UtilitySettings | None:
    """A file's ``utility:`` section (``gradleak utility``'s option names) as the
    fine-tuning's settings, or the located one-line error of its first problem."""
    if given is None:
        return None
    try:
        return utility_settings(given)
    except OptionError as exc:
        raw = next((k for k in given if option_key(k) == exc.option), None)
        flag = f"--{exc.option.replace('_', '-')}" if exc.option else ""
        problem = str(exc).replace(f"invalid {flag}: ", "", 1)
        raise located(path, lines, ("utility", raw) if raw else ("utility",), problem) from None


def _check_option_names(experiment: ExperimentFile) -> None:
    """Every key of fixed, axes, include and exclude is an option, given once."""
    table = all_options()
    spec = experiment.spec
    sections: list[tuple[Location, dict[str, Any]]] = [
        (("fixed",), spec.fixed),
        (("axes",), spec.axes),
    ]
    sections += [(("include", i), rule) for i, rule in enumerate(spec.include)]
    sections += [(("exclude", i), rule) for i, rule in enumerate(spec.exclude)]
    if isinstance(spec.cell_name, list):
        sections += [((CELL_NAME, i, "where"), r.where) for i, r in enumerate(spec.cell_name)]
    for location, mapping in sections:
        for raw in mapping:
            if location[0] == "include" and raw == CELL_NAME:
                continue  # the name of the rule's cells (``_check_cell_names``)
            if option_key(raw) not in table:
                problem = unknown_name(raw, table).replace(
                    f"unknown option '{raw}'", "not an option"
                )
                raise experiment.error((*location, raw), problem)
    fixed = {option_key(k): k for k in spec.fixed}
    for raw, values in spec.axes.items():
        if not values:
            raise experiment.error(("axes", raw), "an axis needs values: give one or more")
        if option_key(raw) in fixed:
            raise experiment.error(
                ("axes", raw), f"also set in fixed ({fixed[option_key(raw)]}): keep one of the two"
            )
    for i, rule in enumerate(spec.exclude):
        if not rule:
            raise experiment.error(("exclude", i), "an empty rule would exclude every cell")


def name_templates(experiment: ExperimentFile) -> list[tuple[str, dict[str, Any], Location]]:
    """``cell_name`` as (template, where, location) rules, first match first."""
    given = experiment.spec.cell_name
    if given is None:
        return []
    if isinstance(given, str):
        return [(given, {}, (CELL_NAME,))]
    return [(rule.name, rule.where, (CELL_NAME, i, "name")) for i, rule in enumerate(given)]


def _check_cell_names(experiment: ExperimentFile) -> None:
    """Every name template is text whose fields are options."""
    templates = [(t, location) for t, _, location in name_templates(experiment)]
    for i, rule in enumerate(experiment.spec.include):
        if CELL_NAME in rule:
            templates.append((rule[CELL_NAME], ("include", i, CELL_NAME)))
    table = all_options()
    for template, location in templates:
        if not isinstance(template, str) or not template.strip():
            raise experiment.error(location, "a cell's name is text: give a name or a template")
        try:
            fields = [field for _, field, _, _ in string.Formatter().parse(template)]
        except ValueError as exc:
            raise experiment.error(location, f"not a name template: {exc}") from None
        for field in fields:
            if field is not None and option_key(field) not in table:
                problem = "name a field by its option: {attack}" if not field else (
                    unknown_name(field, table).replace(f"unknown option '{field}'",
                                                       f"{{{field}}} is not an option")
                )  # fmt: skip
                raise experiment.error(location, problem)


def same_value(a: Any, b: Any) -> bool:
    """Values equal as YAML wrote them or as numbers or text (``1`` and ``'1'``, ``1e-4`` and
    ``0.0001``); None equals nothing."""
    if a is None or b is None:
        return False
    if a == b or str(a) == str(b):
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def option_key(raw: str) -> str:
    """An option name as the config's key: ``--batch-size`` and ``batch-size`` -> ``batch_size``."""
    return str(raw).lstrip("-").replace("-", "_")
