"""cached_conversion: one conversion however many processes ask, never a half-written entry.

The processes are real (multiprocessing with spawn), and the conversion is a slow stand-in
that writes files, so the race is the one two runs starting together would have.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

from gradleak.models.cache import cached_conversion, lock_path, partial_dirs

SLOW = 1.0  # seconds the stand-in conversion takes


def _convert_slowly(out: Path, log: Path, seconds: float = SLOW) -> None:
    with log.open("a") as handle:
        handle.write(f"{os.getpid()}\n")
    (out / "weights.bin").write_bytes(b"\x01" * 4096)
    time.sleep(seconds)
    (out / "config.json").write_text('{"done": true}')


def _worker(target: str, log: str, barrier, results) -> None:
    barrier.wait()  # both processes ask at the same moment
    path = cached_conversion(Path(target), functools.partial(_convert_slowly, log=Path(log)))
    files = {p.name: p.stat().st_size for p in path.iterdir()}
    results.put((os.getpid(), str(path), files))


def _convert_forever(target: str, log: str) -> None:
    cached_conversion(Path(target), functools.partial(_convert_slowly, log=Path(log), seconds=600))


def _entry_files(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in path.iterdir()}


def _leftovers(target: Path) -> list[str]:
    """Everything beside the target except the target and its lock file."""
    return sorted(p.name for p in target.parent.iterdir() if p not in (target, lock_path(target)))


def test_two_processes_at_once_both_get_the_entry_and_it_is_converted_once(tmp_path: Path):
    target = tmp_path / "cache" / "model"
    log = tmp_path / "conversions.log"
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    args = (str(target), str(log), barrier, results)
    procs = [ctx.Process(target=_worker, args=args) for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0, 0]
    got = sorted(results.get(timeout=5) for _ in procs)
    expected = {"weights.bin": 4096, "config.json": len('{"done": true}')}
    assert {pid for pid, _, _ in got} == {proc.pid for proc in procs}
    assert all(path == str(target) and files == expected for _, path, files in got)
    assert len(log.read_text().splitlines()) == 1  # one converted, the other waited and reused
    assert partial_dirs(target) == [] and _leftovers(target) == []


def test_a_failed_conversion_leaves_no_target_and_no_temporary_folder(tmp_path: Path):
    target = tmp_path / "cache" / "model"
    seen: list[Path] = []

    def crash(out: Path) -> None:
        seen.append(out)
        (out / "weights.bin").write_bytes(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        cached_conversion(target, crash)
    assert seen and seen[0].parent == target.parent and seen[0] != target  # wrote beside the target
    assert not target.exists() and not seen[0].exists() and _leftovers(target) == []
    log = tmp_path / "log"
    convert = functools.partial(_convert_slowly, log=log, seconds=0)
    assert cached_conversion(target, convert) == target
    assert _entry_files(target) == {"weights.bin": 4096, "config.json": 14}
    assert len(log.read_text().splitlines()) == 1


def test_a_killed_conversion_is_cleaned_up_by_the_next_one(tmp_path: Path):
    target = tmp_path / "cache" / "model"
    log = tmp_path / "log"
    proc = mp.get_context("spawn").Process(target=_convert_forever, args=(str(target), str(log)))
    proc.start()
    try:
        deadline = time.monotonic() + 60
        while not any((p / "weights.bin").exists() for p in partial_dirs(target)):
            assert time.monotonic() < deadline, "the conversion never started"
            time.sleep(0.05)
    finally:
        proc.kill()  # SIGKILL: no cleanup runs, the lock goes with the process
        proc.join(timeout=30)
    assert not target.exists() and len(partial_dirs(target)) == 1
    cached_conversion(target, functools.partial(_convert_slowly, log=log, seconds=0))
    assert _entry_files(target) == {"weights.bin": 4096, "config.json": 14}
    assert len(log.read_text().splitlines()) == 2  # the killed attempt, then this one
    assert partial_dirs(target) == [] and _leftovers(target) == []


def test_an_existing_entry_is_used_without_converting(tmp_path: Path):
    target = tmp_path / "cache" / "model"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")

    def never(out: Path) -> None:
        pytest.fail("converted an entry that exists")

    assert cached_conversion(target, never) == target
    assert not lock_path(target).exists()  # the fast path takes no lock


def test_an_unusable_entry_is_replaced(tmp_path: Path):
    target = tmp_path / "cache" / "model"
    target.mkdir(parents=True)
    (target / "stale.txt").write_text("from an older layout")
    log = tmp_path / "log"
    convert = functools.partial(_convert_slowly, log=log, seconds=0)
    cached_conversion(target, convert, is_complete=lambda p: (p / "config.json").is_file())
    assert _entry_files(target) == {"weights.bin": 4096, "config.json": 14}
    umask = os.umask(0o022)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask  # as a plain mkdir would make it
