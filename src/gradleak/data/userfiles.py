"""The user's own examples from a file (``file:PATH``), and the row conversion that hub
datasets outside the registry share.

``.csv`` and ``.jsonl`` (and ``.json``, a list of objects or strings) take the text from the
first of the columns ``text``, ``sentence``, ``question`` and an optional integer ``label``
(plus optional ``context``, ``answer_start``, ``answer_text`` for QA). Any other file is plain
text, one example per line. Blank lines and rows with empty text are skipped.
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
from gradleak.data.textio import int_label, lines, optional_int, optional_str, read_text
from gradleak.errors import GradleakError

TEXT_COLUMNS = ("text", "sentence", "question")


def check_file(path: str | Path, encoding: str | None = None) -> tuple[Path, str]:
    """The file and encoding :func:`load_file` would read, checked without reading: a missing
    path, a folder or an unknown encoding is a one-line :class:`GradleakError`."""
    if str(path) == "":
        raise GradleakError("file: needs a path, e.g. file:my_messages.txt")
    path = Path(path).expanduser()
    if not path.exists():
        raise GradleakError(f"file not found: {path}")
    if not path.is_file():
        raise GradleakError(f"not a file: {path}")
    encoding = encoding or "utf-8"
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise GradleakError(f"unknown encoding {encoding!r}: try utf-8 or latin-1") from None
    return path, encoding


def load_file(path: str | Path, encoding: str | None = None) -> list[Example]:
    """Load the examples in ``path`` (UTF-8 unless ``encoding`` is given).

    Every problem (no such file, bad encoding, no text column, a label that is not an integer,
    no examples at all) is a one-line :class:`GradleakError` naming the file and line.
    """
    path, encoding = check_file(path, encoding)
    text = read_text(path, encoding)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        examples = _parse_csv(text, path)
    elif suffix == ".jsonl":
        examples = _parse_jsonl(text, path)
    elif suffix == ".json":
        examples = _parse_json(text, path)
    else:
        examples = [Example(text=line) for line in lines(text) if line.strip()]
    if not examples:
        raise GradleakError(f"{path} holds no examples (every line or row is empty)")
    return examples


def row_example(row: Mapping[str, Any], where: str) -> Example | None:
    """Turn a CSV/JSON/hub row into an Example; None for a row whose text is empty."""
    key = next((k for k in TEXT_COLUMNS if k in row), None)
    if key is None:
        found = ", ".join(map(str, row)) or "none"
        raise GradleakError(
            f"{where}: no text column, expected one of {', '.join(TEXT_COLUMNS)} (found: {found})"
        )
    text = row[key]
    if text is None:
        return None
    if not isinstance(text, str):
        raise GradleakError(f"{where}: {key} must be a string, got {text!r}")
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
    fields = reader.fieldnames or []
    if not any(k in fields for k in TEXT_COLUMNS):
        raise GradleakError(
            f"{path}: no text column in the header, expected one of "
            f"{', '.join(TEXT_COLUMNS)} (found: {', '.join(fields) or 'none'})"
        )
    examples = []
    try:
        for row in reader:
            example = row_example(row, f"{path}, line {reader.line_num}")
            if example is not None:
                examples.append(example)
    except csv.Error as err:
        raise GradleakError(f"{path}, line {reader.line_num}: bad CSV ({err})") from None
    return examples


def _json_item(item: Any, where: str) -> Example | None:
    if isinstance(item, str):
        return Example(text=item) if item.strip() else None
    if isinstance(item, dict):
        return row_example(item, where)
    raise GradleakError(f"{where}: expected an object or a string, got {item!r}")


def _parse_jsonl(text: str, path: Path) -> list[Example]:
    examples = []
    for number, line in enumerate(lines(text), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise GradleakError(f"{path}, line {number}: not valid JSON ({err.msg})") from None
        example = _json_item(item, f"{path}, line {number}")
        if example is not None:
            examples.append(example)
    return examples


def _parse_json(text: str, path: Path) -> list[Example]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise GradleakError(f"{path}, line {err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(data, list):
        raise GradleakError(f"{path}: expected a JSON list of objects or strings")
    examples = []
    for number, item in enumerate(data, start=1):
        example = _json_item(item, f"{path}, item {number}")
        if example is not None:
            examples.append(example)
    return examples
