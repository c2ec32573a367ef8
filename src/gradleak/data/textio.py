"""Reading text files and parsing the values in them, with errors that name the file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradleak.errors import GradleakError, one_line


def size_text(size: int) -> str:
    """A size in bytes as people read it: ``128 MiB``, ``1.5 KiB``, ``12 bytes``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


ENCODING_FIX = "pass its encoding, e.g. --encoding latin-1"


def decode(data: bytes, encoding: str, path: Path, fix: str = ENCODING_FIX) -> str:
    """Decode ``data`` and drop a leading BOM; on failure name the file and the 1-based line of
    the first bad byte, and suggest ``fix`` (``--encoding``)."""
    try:
        text = data.decode(encoding)
    except UnicodeError as err:  # UnicodeDecodeError, or a codec's own (punycode, idna)
        start = getattr(err, "start", None)
        where = ""
        if isinstance(start, int):
            try:
                line = data[:start].decode(encoding, errors="replace").count("\n") + 1
                where = f" (line {line}, byte {start})"
            except UnicodeError:  # a codec without "replace" (idna)
                where = f" (byte {start})"
        raise GradleakError(
            one_line(f"cannot decode {path} as {encoding}{where}: ") + fix
        ) from None
    except LookupError:  # a codec of bytes, not of text (base64, rot13)
        raise GradleakError(f"{encoding!r} is not a text encoding: try utf-8 or latin-1") from None
    return text.removeprefix("\ufeff")


def read_text(
    path: Path,
    encoding: str,
    limit: int | None = None,
    what: str = "file",
    fix: str = ENCODING_FIX,
    advice: str = "",
) -> str:
    """The whole file as text; unreadable or undecodable files raise :class:`GradleakError`
    (suggesting ``fix``), and so does one of more than ``limit`` bytes (when given: ``what``
    names the kind of file the limit is for, ``advice`` what to do), before it is read."""
    try:
        size = path.stat().st_size
        if limit is not None and size > limit:
            raise _too_large(path, size, limit, what, advice)
        with path.open("rb") as handle:  # a file that grows while it is read stops at the limit
            data = handle.read() if limit is None else handle.read(limit + 1)
    except OSError as err:
        raise GradleakError(one_line(f"cannot read {path}: {err.strerror or err}")) from None
    if limit is not None and len(data) > limit:
        raise _too_large(path, len(data), limit, what, advice)
    return decode(data, encoding, path, fix)


def _too_large(path: Path, size: int, limit: int, what: str, advice: str) -> GradleakError:
    problem = f"{path} is {size_text(size)}, over the {size_text(limit)} limit for {what}s"
    return GradleakError(one_line(problem) + (f": {advice}" if advice else ""))


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
