"""Worker processes of a parallel run (``--workers``) end with the run, however it ends."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from gradleak.experiment import _stop_workers

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def _stat(pid: int | str) -> tuple[str, int] | None:
    """A live process's (state, parent pid) from /proc; None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else (fields[0], int(fields[1]))


def _children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    return {
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and (_stat(entry.name) or ("", 0))[1] == pid
    }


def _workers(pid: int) -> set[int]:
    """The pool workers among ``pid``'s children (not the resource tracker beside them)."""
    found = set()
    for child in _children(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in command:
            found.add(child)
    return found


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if _stat(pid) is not None}


def _wait_for(condition, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    return condition()


@needs_proc
def test_workers_exit_when_the_run_is_killed(tmp_path):
    """SIGKILL runs no cleanup in the parent: the workers notice it is gone and exit."""
    script = textwrap.dedent(
        f"""
        import torch
        from gradleak import experiment
        from gradleak.config import validate_config

        torch.set_num_threads(2)
        config = validate_config(
            model="tiny-bert", n_inputs=4, protocol={{"mode": "eval"}},
            attack_settings={{"steps": 100000}},
        )
        experiment.run(config, out={str(tmp_path / "run.json")!r}, workers=2)
        """
    )
    run = subprocess.Popen([sys.executable, "-c", script])
    try:
        workers = _wait_for(lambda: len(_workers(run.pid)) == 2 and _workers(run.pid), 120)
        assert workers, "the run never started its two workers"
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        assert _wait_for(lambda: not _alive(workers), 15), f"orphans: {_alive(workers)}"
    finally:
        if run.poll() is None:
            run.kill()
        for pid in _alive(_children(run.pid)):
            os.kill(pid, signal.SIGKILL)


@needs_proc
def test_stopping_a_pool_ends_its_busy_workers_at_once():
    """What an error or an interrupt in the parent calls: queued work is cancelled and the
    busy workers end now, instead of the pool waiting for their inputs to finish."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(2, mp_context=context)
    futures = [pool.submit(time.sleep, 60) for _ in range(4)]
    workers = _wait_for(lambda: len(_children(os.getpid()) & set(pool._processes)) == 2, 60)
    assert workers, "the pool never started its workers"
    busy = set(pool._processes)
    began = time.monotonic()
    _stop_workers(pool)
    pool.shutdown(wait=True)
    assert time.monotonic() - began < 20
    assert not _alive(busy)
    assert all(f.cancelled() or f.done() for f in futures)
