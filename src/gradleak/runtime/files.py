"""Files gradleak leaves behind.

* :func:`write_atomic`: a result file (a record, a report) is written whole or not at all: to
  a temporary file beside it, synced, then moved over it in one step, so a run killed while
  writing leaves the old file or the new one, never half of one; a folder that cannot be
  written is a one-line :class:`~gradleak.errors.GradleakError`.
* :func:`read_only_sqlite`: a results database opened for reading only (its path quoted as
  a URI, so a folder named ``a?b#c`` is that folder), which never writes, not even where the
  folder is read-only.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from contextlib import suppress
from pathlib import Path

from gradleak.errors import GradleakError


def write_atomic(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` whole: the file holds its old content or the new one at every
    moment, even if the process is killed part-way. Makes the folder if it is missing.

    Raises:
        GradleakError: The file or its folder cannot be written (one line: the path and why).
    """
    path = Path(path)
    data = text.encode(encoding)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # 0o666 less the umask, as an ordinary open() would make it
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(descriptor, view) :]
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            with suppress(OSError):  # an existing file keeps its permissions
                os.chmod(temporary, path.stat().st_mode & 0o7777)
            os.replace(temporary, path)
        except BaseException:
            with suppress(OSError):
                temporary.unlink()
            raise
        _sync_folder(path.parent)
    except OSError as exc:
        raise GradleakError(f"cannot write {path}: {_reason(exc)}") from None
    return path


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (where the system lets a folder be synced)."""
    with suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def sqlite_uri(path: str | Path, **parameters: str) -> str:
    """A ``file:`` URI naming ``path`` exactly (``?``, ``#``, ``%`` and spaces quoted), with
    ``parameters`` as its query (``mode="ro"``)."""
    uri = Path(path).absolute().as_uri()
    query = "&".join(f"{key}={value}" for key, value in parameters.items())
    return f"{uri}?{query}" if query else uri


def read_only_sqlite(path: str | Path, timeout: float = 60.0) -> sqlite3.Connection:
    """``path`` opened to read, never to write (a write through it raises
    ``sqlite3.OperationalError``). A database in WAL mode whose folder is read-only (where
    SQLite cannot make its shared-memory file, so no writer can be at work in it) is read
    as an immutable file.

    Raises:
        sqlite3.Error: The file is not a database this connection can read.
    """
    connection = sqlite3.connect(sqlite_uri(path, mode="ro"), uri=True, timeout=timeout)
    try:
        connection.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        connection.close()
        if getattr(exc, "sqlite_errorname", "") not in ("SQLITE_READONLY_DIRECTORY",
                                                        "SQLITE_CANTOPEN"):  # fmt: skip
            raise
        connection = sqlite3.connect(
            sqlite_uri(path, mode="ro", immutable="1"), uri=True, timeout=timeout
        )
    return connection
