"""The user's own examples from a file (``file:PATH``), and the row conversion that hub
datasets outside the registry share.

``.csv`` and ``.jsonl`` (and ``.json``, a list of objects or strings) take the text from the
first of the columns ``text``, ``sentence``, ``question`` and an optional integer ``label``
(plus optional ``context``, ``answer_start``, ``answer_text`` for QA). Any other file is plain
text, one example per line. Blank lines and rows with empty text are skipped.

A user file is bounded, so that a careless or hostile one is a one-line error rather than a
machine out of memory or a crash: at most :data:`MAX_FILE_BYTES` (128 MiB; checked before it
is read), a line (and a JSON file's example text) of at most :data:`MAX_LINE_CHARS`
characters, and JSON nested at most :data:`MAX_JSON_DEPTH` levels deep. An attack reads a few
batches of short texts: a sample of a larger corpus serves it as well.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gradleak.data.examples import Example
from gradleak.data.textio import (
    int_label,
    lines,
    one_line,
    optional_int,
    optional_str,
    read_text,
)
from gradleak.errors import GradleakError

TEXT_COLUMNS = ("text", "sentence", "question")
MAX_FILE_BYTES = 128 * 2**20  # a user file's size
MAX_LINE_CHARS = 1_000_000  # a line's (and one example's text's) characters
MAX_JSON_DEPTH = 32  # JSON nesting: a file is a list of objects, so 2 levels are what it needs
# Codecs of domain names, not of files (punycode decodes in quadratic time: a megabyte takes
# minutes).
NOT_FILE_ENCODINGS = ("idna", "punycode")


def _error(message: str) -> GradleakError:
    """A one-line error, whatever of the file (keys, paths) it echoes."""
    return GradleakError(one_line(message))


def check_file(path: str | Path, encoding: str | None = None) -> tuple[Path, str]:
    """The file and encoding :func:`load_file` would read, checked without reading: a missing
    path, a folder or an unknown encoding is a one-line :class:`GradleakError`."""
    if str(path) == "":
        raise GradleakError("file: needs a path, e.g. file:my_messages.txt")
    path = Path(path)
    try:
        path = path.expanduser()
        found, is_file = path.exists(), path.is_file()
    except (OSError, RuntimeError, ValueError):  # ~nobody, a name too long, a NUL byte
        found = is_file = False
    if not found:
        raise _error(f"file not found: {path}")
    if not is_file:
        raise _error(f"not a file: {path}")
    encoding = encoding or "utf-8"
    try:
        codec = codecs.lookup(encoding)
    except LookupError:
        raise _error(f"unknown encoding {encoding!r}: try utf-8 or latin-1") from None
    try:
        b"".decode(encoding)  # a codec of bytes (base64, rot13) is no text encoding
    except LookupError:
        raise _error(f"{encoding!r} is not a text encoding: try utf-8 or latin-1") from None
    if codec.name in NOT_FILE_ENCODINGS:
        raise _error(f"{encoding!r} encodes domain names, not files: try utf-8 or latin-1")
    return path, encoding


def load_file(path: str | Path, encoding: str | None = None) -> list[Example]:
    """Load the examples in ``path`` (UTF-8 unless ``encoding`` is given).

    Every problem (no such file, bad encoding, no text column, a label that is not an integer,
    no examples at all) is a one-line :class:`GradleakError` naming the file and line.
    """
    path, encoding = check_file(path, encoding)
    text = read_text(path, encoding, limit=MAX_FILE_BYTES, what="user file")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        examples = _parse_csv(text, path)
    elif suffix == ".jsonl":
        examples = _parse_jsonl(text, path)
    elif suffix == ".json":
        examples = _parse_json(text, path)
    else:
        examples = []
        for number, line in enumerate(lines(text), start=1):
            _check_length(line, f"{path}, line {number}")
            if line.strip():
                examples.append(Example(text=line))
    if not examples:
        raise _error(f"{path} holds no examples (every line or row is empty)")
    return examples


def _check_length(text: str, where: str) -> None:
    if len(text) > MAX_LINE_CHARS:
        raise _error(
            f"{where} has {len(text):,} characters, over the {MAX_LINE_CHARS:,} characters "
            "an example may have: split it, or give a sample of the file"
        )


def row_example(row: Mapping[str, Any], where: str) -> Example | None:
    """Turn a CSV/JSON/hub row into an Example; None for a row whose text is empty."""
    key = next((k for k in TEXT_COLUMNS if k in row), None)
    if key is None:
        found = ", ".join(map(str, row)) or "none"
        raise _error(
            f"{where}: no text column, expected one of {', '.join(TEXT_COLUMNS)} (found: {found})"
        )
    text = row[key]
    if text is None:
        return None
    if not isinstance(text, str):
        raise _error(f"{where}: {key} must be a string, got {_shown(text)}")
    _check_length(text, where)
    if not text.strip():
        return None
    return Example(
        text=text,
        label=int_label(row.get("label"), where),
        context=optional_str(row.get("context")),
        answer_start=optional_int(row.get("answer_start"), "answer_start", where),
        answer_text=optional_str(row.get("answer_text")),
    )


def _parse_csv(text: str, path: Path) -> list[Example]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        fields = reader.fieldnames or []
        if not any(k in fields for k in TEXT_COLUMNS):
            raise _error(
                f"{path}: no text column in the header, expected one of "
                f"{', '.join(TEXT_COLUMNS)} (found: {', '.join(fields) or 'none'})"
            )
        examples = []
        for row in reader:
            example = row_example(row, f"{path}, line {reader.line_num}")
            if example is not None:
                examples.append(example)
    except csv.Error as err:
        raise _error(f"{path}, line {reader.line_num}: bad CSV ({err})") from None
    return examples


def _json_item(item: Any, where: str) -> Example | None:
    if isinstance(item, str):
        _check_length(item, where)
        return Example(text=item) if item.strip() else None
    if isinstance(item, dict):
        return row_example(item, where)
    raise _error(f"{where}: expected an object or a string, got {_shown(item)}")


def _shown(value: Any, limit: int = 60) -> str:
    """A value as an error message shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json(text: str, where: str, line: int | None = None) -> Any:
    """``text`` parsed as JSON nested at most :data:`MAX_JSON_DEPTH` levels; a one-line error
    naming ``where`` (and the line, in a file of one document) otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        at = f", line {err.lineno}" if line is None else ""
        raise _error(f"{where}{at}: not valid JSON ({err.msg})") from None
    except ValueError:  # a number of more digits than Python converts (4300)
        raise _error(f"{where}: not valid JSON here (a number thousands of digits long)") from None
    except RecursionError:  # deeper than Python's stack: far over the limit
        data, depth = None, MAX_JSON_DEPTH + 1
    else:
        depth = _depth(data)
    if depth > MAX_JSON_DEPTH:
        raise _error(
            f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels: a user file is a list "
            "of objects (or one object a line) of text and label"
        )
    return data


def _depth(data: Any) -> int:
    """How deeply lists and objects nest in ``data`` (0 for a plain value), walked without
    recursion; it stops counting past the limit."""
    deepest = 0
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if not isinstance(value, dict | list):
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            break
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _parse_jsonl(text: str, path: Path) -> list[Example]:
    examples = []
    for number, line in enumerate(lines(text), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        _check_length(line, where)
        example = _json_item(_json(line, where, number), where)
        if example is not None:
            examples.append(example)
    return examples


def _parse_json(text: str, path: Path) -> list[Example]:
    data = _json(text, str(path))
    if not isinstance(data, list):
        raise _error(f"{path}: expected a JSON list of objects or strings")
    examples = []
    for number, item in enumerate(data, start=1):
        example = _json_item(item, f"{path}, item {number}")
        if example is not None:
            examples.append(example)
    return examples
