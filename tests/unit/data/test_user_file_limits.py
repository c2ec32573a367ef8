"""The user's own data files (``file:PATH``) under hostile or careless input: a file too large,
a line too long, JSON nested too deep, an encoding that is no text encoding, a key or a path
that would break the error's line. Each is a one-line GradleakError that names the limit."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gradleak.data import userfiles
from gradleak.data.textio import decode
from gradleak.data.userfiles import (
    MAX_FILE_BYTES,
    MAX_JSON_DEPTH,
    MAX_LINE_CHARS,
    load_file,
)
from gradleak.errors import GradleakError


def refused(path: Path, encoding: str | None = None) -> str:
    """The one line ``load_file`` refuses ``path`` with."""
    with pytest.raises(GradleakError) as caught:
        load_file(path, encoding)
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    return message


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.txt"
    with path.open("wb") as handle:  # sparse: nothing is written, nothing would be read
        handle.truncate(MAX_FILE_BYTES + 1)
    start = time.perf_counter()
    message = refused(path)
    assert time.perf_counter() - start < 1.0
    assert "over the 128 MiB limit for user files" in message and str(path) in message


def test_the_size_limit_holds_for_a_file_that_grows_while_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "mine.txt"
    path.write_text("a line\n" * 100)
    monkeypatch.setattr(userfiles, "MAX_FILE_BYTES", 100)
    assert "over the 100 bytes limit for user files" in refused(path)


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_a_line_over_the_line_limit_names_the_line_and_the_limit(tmp_path, suffix):
    path = tmp_path / f"mine{suffix}"
    long = "a" * (MAX_LINE_CHARS + 1)
    path.write_text('"ok"\n' + (json.dumps(long) if suffix == ".jsonl" else long) + "\n")
    message = refused(path)
    assert "line 2" in message and f"{MAX_LINE_CHARS:,} characters" in message


def test_one_json_example_over_the_line_limit_is_refused(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([{"text": "a" * (MAX_LINE_CHARS + 1)}]))
    message = refused(path)
    assert "item 1" in message and f"{MAX_LINE_CHARS:,} characters" in message


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_json_nested_deeper_than_the_limit_is_a_one_line_error(tmp_path, suffix, depth):
    path = tmp_path / f"deep{suffix}"
    nested = "[" * depth + "]" * depth
    path.write_text(f'[{{"text": "a", "x": {nested}}}]' if suffix == ".json" else nested)
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in refused(path)


def test_json_nested_within_the_limit_loads(tmp_path):
    path = tmp_path / "fine.json"
    nested = "[" * (MAX_JSON_DEPTH - 3) + "]" * (MAX_JSON_DEPTH - 3)
    path.write_text(f'[{{"text": "a", "meta": {nested}}}]')
    assert [e.text for e in load_file(path)] == ["a"]


@pytest.mark.parametrize("encoding", ["rot13", "base64", "hex", "zlib"])
def test_a_codec_that_is_no_text_encoding_is_refused(tmp_path, encoding):
    path = tmp_path / "mine.txt"
    path.write_text("hello\n")
    assert "not a text encoding" in refused(path, encoding)


@pytest.mark.parametrize("encoding", ["punycode", "idna"])
def test_a_codec_of_domain_names_is_refused(tmp_path, encoding):
    path = tmp_path / "mine.txt"
    path.write_bytes(b"a" * 1000)  # punycode would decode a megabyte for minutes
    assert "encodes domain names, not files" in refused(path, encoding)


@pytest.mark.parametrize(("data", "encoding"), [(b"\x00\x80", "idna"), (b"\x80", "punycode")])
def test_a_codec_s_own_decoding_error_is_one_line(data, encoding):
    with pytest.raises(GradleakError) as caught:
        decode(data, encoding, Path("mine.txt"))
    assert "cannot decode mine.txt" in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


def test_what_an_error_echoes_of_the_file_stays_one_line(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"te\nxt": 1, "\u2028": 2}) + "\n")
    assert "no text column" in refused(path)
    csv = tmp_path / "mine.csv"
    csv.write_text('"bo\x1edy",label\nhello,1\n')
    assert "no text column" in refused(csv)


def test_paths_the_system_cannot_take_are_one_line_errors(tmp_path):
    assert "file not found" in refused(Path("~no-such-user-here/notes.txt"))
    assert "file not found" in refused(tmp_path / ("x" * 5000))
    assert "file not found" in refused(Path(os.fspath(tmp_path) + "/a\x00b"))
