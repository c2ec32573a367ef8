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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gradleak.errors import GradleakError, OptionError
from gradleak.options import all_options, unknown_name

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
        line = next(
            (self.lines[location[:cut]] for cut in range(len(location), 0, -1)
             if location[:cut] in self.lines),
            None,
        )  # fmt: skip
        key = ".".join(str(part) for part in location)
        where = f"{self.path}:{line}" if line else str(self.path)
        return ExperimentError(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


def read_experiment(path: str | Path) -> ExperimentFile:
    """Read and check an experiment file's shape and option names (the cells' values are
    checked when the grid is expanded: ``gradleak.experiments.grid``)."""
    path = Path(path)
    if not path.is_file():
        raise GradleakError(f"experiment file {path} does not exist: give the path of a YAML file")
    text = path.read_text(encoding="utf-8")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ExperimentError(f"{path}{line}: not valid YAML: {problem}") from None
    lines = _key_lines(root)
    if not isinstance(data, dict):
        raise ExperimentError(f"{path}: an experiment file is a mapping with fixed: and axes:")
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = tuple(first["loc"])
        problem = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            allowed = ", ".join(ExperimentSpec.model_fields)
            problem = f"not a key of an experiment file (allowed: {allowed})"
        raise ExperimentFile(path, ExperimentSpec(), lines).error(location, problem) from None
    experiment = ExperimentFile(path, spec, lines)
    _check_option_names(experiment)
    return experiment


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
