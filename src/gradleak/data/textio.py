"""Reading text files and parsing the values in them, with errors that name the file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradleak.errors import GradleakError


def decode(data: bytes, encoding: str, path: Path) -> str:
    """Decode ``data`` and drop a leading BOM; on failure name the file and the 1-based line of
    the first bad byte, and suggest ``--encoding``."""
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as err:
        line = data[: err.start].decode(encoding, errors="replace").count("\n") + 1
        raise GradleakError(
            f"cannot decode {path} as {encoding} (line {line}, byte {err.start}): "
            f"pass its encoding, e.g. --encoding latin-1"
        ) from None
    return text.removeprefix("\ufeff")


def read_text(path: Path, encoding: str) -> str:
    """The whole file as text; unreadable or undecodable files raise :class:`GradleakError`."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise GradleakError(f"cannot read {path}: {err.strerror or err}") from None
    return decode(data, encoding, path)


def lines(text: str) -> list[str]:
    """Split on '\\n' only (str.splitlines also breaks at U+0085, which latin-1 text contains);
    a trailing '\\r' is dropped from each line and a final empty line is not returned."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return [part.removesuffix("\r") for part in parts]


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "")


def int_label(value: Any, where: str) -> int | None:
    """A class label: None for a missing or blank value, else an integer (``"1"``, ``1``,
    ``1.0``); booleans, fractions and words raise :class:`GradleakError` naming ``where``."""
    if _blank(value):
        return None
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise GradleakError(f"{where}: label {value!r} is not an integer") from None


def optional_int(value: Any, column: str, where: str) -> int | None:
    """An optional integer column (e.g. ``answer_start``): None when missing or blank."""
    if _blank(value):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise GradleakError(f"{where}: {column} {value!r} is not an integer") from None


def optional_str(value: Any) -> str | None:
    """An optional text column: None when missing or empty, else the value as a string."""
    return None if value is None or value == "" else str(value)
