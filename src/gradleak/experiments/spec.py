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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gradleak.errors import GradleakError, OptionError
from gradleak.options import all_options, unknown_name, utility_settings
from gradleak.utility import UtilitySettings

Location = tuple[str | int, ...]  # a key's place in the file: ("axes", "attack", 1)


class ExperimentError(OptionError):
    """A problem with an experiment file, located: ``file:line: key: problem``."""


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

    @field_validator("name")
    @classmethod
    def _name_is_a_folder_name(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "/" in value or value.startswith(".")):
            raise ValueError(f"'{value}' cannot name a folder: use letters, digits, - and _")
        return value


class ExperimentFile:
    """A parsed experiment file: its declaration, where each key sits, and its folder (the
    base of relative paths inside it)."""

    def __init__(self, path: Path, spec: ExperimentSpec, lines: dict[Location, int]) -> None:
        self.path, self.spec, self.lines = path, spec, lines

    @property
    def name(self) -> str:
        return self.spec.name or self.path.stem

    def error(self, location: Location, problem: str) -> ExperimentError:
        """``file:line: key: problem`` for the key at ``location`` (or its nearest parent)."""
        return located(self.path, self.lines, location, problem)


def located(
    path: Path, lines: dict[Location, int], location: Location, problem: str
) -> ExperimentError:
    """The error ``file:line: key: problem`` for the key at ``location`` of a YAML file whose
    keys sit at ``lines`` (the line of the nearest parent when the key has none)."""
    line = next(
        (lines[location[:cut]] for cut in range(len(location), 0, -1) if location[:cut] in lines),
        None,
    )
    key = ".".join(str(part) for part in location)
    where = f"{path}:{line}" if line else str(path)
    return ExperimentError(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


def read_experiment(path: str | Path) -> ExperimentFile:
    """Read and check an experiment file's shape and option names (the cells' values are
    checked when the grid is expanded: ``gradleak.experiments.grid``)."""
    path = Path(path)
    data, lines = read_yaml(path, "experiment file")
    if not isinstance(data, dict):
        raise ExperimentError(f"{path}: an experiment file is a mapping with fixed: and axes:")
    spec = validated(ExperimentSpec, data, path, lines)
    experiment = ExperimentFile(path, spec, lines)
    _check_option_names(experiment)
    utility_of(experiment)
    if spec.published is not None:
        published = (path.parent / spec.published).resolve()
        if not published.is_file():
            raise experiment.error(("published",), f"{published} does not exist: fix the path")
    return experiment


def utility_of(experiment: ExperimentFile) -> UtilitySettings | None:
    """The fine-tuning that measures utility, when the file asks for one (validated)."""
    return utility_at(experiment.path, experiment.lines, experiment.spec.utility)


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


def read_yaml(path: Path, what: str) -> tuple[Any, dict[Location, int]]:
    """A YAML file's data and the line of each of its keys; a one-line error where it is
    missing or not YAML."""
    if not path.is_file():
        raise GradleakError(f"{what} {path} does not exist: give the path of a YAML file")
    text = path.read_text(encoding="utf-8")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ExperimentError(f"{path}{line}: not valid YAML: {problem}") from None
    return data, _key_lines(root)


Model = TypeVar("Model", bound=BaseModel)


def validated(model: type[Model], data: Any, path: Path, lines: dict[Location, int]) -> Model:
    """``data`` as ``model``, or pydantic's first complaint located in the file."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = tuple(first["loc"])
        problem = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            allowed = ", ".join(model.model_fields)
            problem = f"not a key here (allowed: {allowed})"
        raise located(path, lines, location, problem) from None


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
    for location, mapping in sections:
        for raw in mapping:
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


def _key_lines(node: yaml.Node | None, location: Location = ()) -> dict[Location, int]:
    """The 1-based line of every mapping key and sequence item under ``node``."""
    lines: dict[Location, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            where = (*location, key_node.value)
            lines[where] = key_node.start_mark.line + 1
            lines |= _key_lines(value_node, where)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*location, i)] = item.start_mark.line + 1
            lines |= _key_lines(item, (*location, i))
    return lines
