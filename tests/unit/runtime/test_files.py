"""Result files written whole or not at all, SQLite files read without writing, and text
from outside made safe for a terminal (``gradleak.runtime.files``)."""

from __future__ import annotations

import errno
import os
import sqlite3

import pytest

from gradleak.errors import GradleakError
from gradleak.runtime import files


def test_write_atomic_writes_the_text_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "new" / "record.json"
    assert files.write_atomic(path, '{"a": 1}\n') == path
    assert path.read_text(encoding="utf-8") == '{"a": 1}\n'
    files.write_atomic(path, "second")
    assert path.read_text(encoding="utf-8") == "second"
    assert sorted(p.name for p in path.parent.iterdir()) == ["record.json"]


def test_write_atomic_keeps_an_existing_files_permissions(tmp_path):
    path = tmp_path / "report.html"
    path.write_text("old")
    path.chmod(0o640)
    files.write_atomic(path, "new")
    assert path.stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("fail_at", ["write", "fsync", "replace"])
def test_a_write_that_fails_part_way_leaves_the_old_file_whole(tmp_path, monkeypatch, fail_at):
    """A full disk after half the bytes (or a failing sync or rename): the old file is as it
    was, no temporary file stays, and the error is one line naming the file and why."""
    path = tmp_path / "record.json"
    old = '{"samples": [1, 2, 3]}\n'
    path.write_text(old, encoding="utf-8")
    real_write = os.write

    def half_then_full(descriptor, data):
        real_write(descriptor, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    def broken(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    if fail_at == "write":
        monkeypatch.setattr(files.os, "write", half_then_full)
    else:
        monkeypatch.setattr(files.os, fail_at, broken)
    with pytest.raises(GradleakError) as caught:
        files.write_atomic(path, '{"samples": [' + "4, " * 10_000 + "5]}\n")
    message = str(caught.value)
    assert message.startswith(f"cannot write {path}: ") and "\n" not in message
    assert ("No space left" if fail_at == "write" else "Input/output error") in message
    assert path.read_text(encoding="utf-8") == old
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_kill_part_way_leaves_the_old_file_whole(tmp_path, monkeypatch):
    """An interruption that is not an OSError (Ctrl-C, a signal) propagates as it is, and the
    file is still the old one."""
    path = tmp_path / "record.json"
    path.write_text("old", encoding="utf-8")

    def interrupted(descriptor):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(path, "new")
    assert path.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_folder_that_cannot_exist_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(GradleakError, match=r"^cannot write .*a-file/x\.json: \S.*$"):
        files.write_atomic(blocker / "x.json", "text")


@pytest.mark.parametrize("name", ["a?b#c", "100% sure", "spa ce"])
def test_sqlite_uri_names_the_file_exactly(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "x.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE t (a)")
    connection.execute("INSERT INTO t VALUES (7)")
    connection.commit()
    connection.close()
    reader = files.read_only_sqlite(path)
    try:
        assert reader.execute("SELECT a FROM t").fetchall() == [(7,)]
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.execute("INSERT INTO t VALUES (8)")
    finally:
        reader.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no stray file beside it
    assert sorted(p.name for p in folder.iterdir()) == ["x.sqlite"]
