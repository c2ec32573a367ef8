"""Experiment, audit setup and Flower setup files written to hurt: a YAML alias bomb (a
"billion laughs"), nesting deeper than any declaration needs, a file too large or not UTF-8.
Each is a one-line error, found in well under a second."""

from __future__ import annotations

import time

import pytest

from gradleak.audit.setup import read_setup
from gradleak.errors import GradleakError
from gradleak.experiments.spec import read_experiment
from gradleak.experiments.yaml_files import MAX_YAML_BYTES, MAX_YAML_DEPTH
from gradleak.integrations.flower.setup import load_setup

READERS = {"experiment": read_experiment, "audit setup": read_setup, "flower setup": load_setup}


def alias_bomb(levels: int = 9) -> str:
    """About 300 bytes whose aliases expand to 10**levels entries."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nsetup: {{model: *a{levels - 1}}}\n"


def refused(reader, path) -> str:
    start = time.perf_counter()
    with pytest.raises(GradleakError) as caught:
        reader(path)
    assert time.perf_counter() - start < 0.5
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    return message


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
def test_an_alias_bomb_is_a_one_line_error_at_once(tmp_path, reader):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    message = refused(reader, path)
    assert "bomb.yaml:2" in message and "alias" in message


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
def test_an_anchor_alone_is_harmless(tmp_path, reader):
    path = tmp_path / "anchored.yaml"
    path.write_text("name: &n plain\n")
    try:
        reader(path)
    except GradleakError as exc:
        assert "alias" not in str(exc)


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
@pytest.mark.parametrize("depth", [MAX_YAML_DEPTH + 1, 50_000])
def test_nesting_deeper_than_the_limit_is_a_one_line_error(tmp_path, reader, depth):
    path = tmp_path / "deep.yaml"
    path.write_text("fixed: " + "[" * depth + "]" * depth + "\n")
    assert f"nested deeper than {MAX_YAML_DEPTH} levels" in refused(reader, path)


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
def test_a_file_too_large_or_not_utf8_is_a_one_line_error(tmp_path, reader):
    large = tmp_path / "large.yaml"
    with large.open("wb") as handle:
        handle.truncate(MAX_YAML_BYTES + 1)
    assert "over the 1 MiB limit" in refused(reader, large)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: caf\xe9\n")
    assert "cannot decode" in refused(reader, binary)


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("data_dir", "x" * 300, "over 255 bytes"),
        ("dataset", "file:" + "x" * 300, "over 255 bytes"),
        ("data_dir", "~no-such-user/d", "home folder"),
        ("dataset", "file:~no-such-user/d.txt", "home folder"),
    ],
)
def test_a_path_the_system_cannot_take_is_a_located_error(tmp_path, option, value, problem):
    from gradleak.experiments.execute import load_experiment

    path = tmp_path / "experiment.yaml"
    path.write_text(f"fixed: {{model: tiny-bert, {option}: '{value}'}}\n")
    with pytest.raises(GradleakError, match=problem):
        load_experiment(path)
