"""Worker processes of a parallel run (``--workers``) end with the run, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from gradleak.config.options import config_from_options
from gradleak.running import runner

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
        from gradleak.running import runner
        from gradleak.config.options import config_from_options

        torch.set_num_threads(2)
        config = config_from_options(
            {{"model": "tiny-bert", "n_inputs": 4, "mode": "eval", "steps": 100000}}
        )
        runner.run(config, out={str(tmp_path / "run.json")!r}, workers=2)
        """
    )
    run = subprocess.Popen([sys.executable, "-c", script])
    try:
        workers = _wait_for(lambda: len(_workers(run.pid)) == 2 and _workers(run.pid), 120)
        assert workers, "the run never started its two workers"
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        # a worker still importing torch notices once its start-up code runs: slow on a busy machine
        assert _wait_for(lambda: not _alive(workers), 60), f"orphans: {_alive(workers)}"
    finally:
        if run.poll() is None:
            run.kill()
        for pid in _alive(_children(run.pid)):
            os.kill(pid, signal.SIGKILL)


class Interrupt(Exception):
    pass


@needs_proc
def test_an_interrupted_parallel_run_ends_its_busy_workers_at_once(tmp_path):
    """What Ctrl-C (or an error) in the parent does: the queued inputs are cancelled and the
    busy workers end now, instead of the run waiting for inputs that would take hours."""
    config = config_from_options(
        {"model": "tiny-bert", "n_inputs": 4, "mode": "eval", "steps": 100000}
    )
    busy: dict[str, set[int]] = {}

    def interrupt_once_both_work() -> None:
        workers = _wait_for(lambda: len(_workers(os.getpid())) == 2 and _workers(os.getpid()), 120)
        time.sleep(2)  # past their start: attacking an input each
        busy["workers"] = workers or set()
        os.kill(os.getpid(), signal.SIGUSR1)

    def raise_interrupt(signum, frame):
        raise Interrupt

    previous_handler = signal.signal(signal.SIGUSR1, raise_interrupt)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    watcher = threading.Thread(target=interrupt_once_both_work, daemon=True)
    try:
        watcher.start()
        with pytest.raises(Interrupt):
            runner.run(config, out=str(tmp_path / "run.json"), workers=2)
        stopped_at = time.monotonic()
    finally:
        signal.signal(signal.SIGUSR1, previous_handler)
        torch.set_num_threads(previous_threads)
    assert len(busy["workers"]) == 2, "the run never started its two workers"
    assert _wait_for(lambda: not _alive(busy["workers"]), 10), _alive(busy["workers"])
    assert time.monotonic() - stopped_at < 10
