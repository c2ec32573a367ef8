"""YAML files read within bounds, with the line of every key kept, so that each problem is
reported as ``file:line: key: problem``.

Every YAML file gradleak reads (experiment files, published figures, an audit's setup, a
Flower federation's) goes through :func:`load_yaml`, which bounds what a careless or hostile
file costs: at most :data:`MAX_YAML_BYTES`, nested at most :data:`MAX_YAML_DEPTH` levels, and
no aliases (``*name``: each one repeats a whole value, and a few hundred bytes of them expand
to billions of entries; ``extends:`` is how one experiment file reuses another's declaration).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gradleak.data.textio import read_text
from gradleak.errors import GradleakError, OptionError, one_line

Location = tuple[str | int, ...]  # a key's place in the file: ("axes", "attack", 1)
MAX_YAML_BYTES = 2**20  # an experiment or setup file is a page of declarations
MAX_YAML_DEPTH = 32  # levels of nesting (a declaration needs four or five)


class ExperimentError(OptionError):
    """A problem with an experiment file, located: ``file:line: key: problem`` (one line,
    whatever of the file it echoes)."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(one_line(message), option)


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


def read_yaml(path: Path, what: str) -> tuple[Any, dict[Location, int]]:
    """A YAML file's data and the line of each of its keys; a one-line error where it is
    missing, too large or not YAML (see :func:`load_yaml`)."""
    root, data = load_yaml(path, what)
    return data, _key_lines(root)


def load_yaml(path: Path, what: str) -> tuple[yaml.Node | None, Any]:
    """A YAML file's node tree and its data, read within bounds: at most
    :data:`MAX_YAML_BYTES` of UTF-8, nested at most :data:`MAX_YAML_DEPTH` levels, without
    aliases. Every problem is an :class:`ExperimentError` of one line naming the file (and
    the line, where there is one)."""
    try:
        found = path.is_file()
    except (OSError, ValueError):  # a name too long
        found = False
    if not found:
        raise GradleakError(one_line(f"{what} {path} does not exist: give the path of a YAML file"))
    text = read_text(path, "utf-8", MAX_YAML_BYTES, what, fix="save it as UTF-8")
    loader = None
    try:
        loader = _BoundedLoader(text)  # its reader refuses control characters at once
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if not isinstance(exc, _Refused):
            problem = f"not valid YAML: {problem}"
        raise ExperimentError(f"{path}{line}: {problem}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return root, data


class _Refused(yaml.MarkedYAMLError):
    """YAML that :class:`_BoundedLoader` does not read (an alias, nesting too deep)."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses aliases and nesting deeper than
    :data:`MAX_YAML_DEPTH` while it composes the node tree: before anything is expanded
    (the alias bomb) or recursed into (PyYAML composes and constructs recursively)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                problem=f"an alias (*{event.anchor}) repeats another value, and gradleak reads "
                "no aliases: write the value out, or extend another file (extends:)",
                problem_mark=event.start_mark,
            )
        nests = isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent)
        if nests and self._depth >= MAX_YAML_DEPTH:
            raise _too_deep(event.start_mark)
        self._depth += nests
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= nests

    def fetch_flow_collection_start(self, token: type[yaml.Token]) -> None:
        # [[[[...: refused as the scanner meets it (its look-ahead for keys is quadratic)
        if self.flow_level >= MAX_YAML_DEPTH:
            raise _too_deep(self.get_mark())
        super().fetch_flow_collection_start(token)


def _too_deep(mark: yaml.Mark) -> _Refused:
    return _Refused(
        problem=f"nested deeper than {MAX_YAML_DEPTH} levels: a declaration needs a few",
        problem_mark=mark,
    )


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
