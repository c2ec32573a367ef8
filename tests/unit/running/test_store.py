"""A single run's files (``running.store.ResultStore``): a kill at any moment, a torn line,
and two runs on one ``--out``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from gradleak.config.options import config_from_options
from gradleak.errors import GradleakError
from gradleak.running import store as store_module
from gradleak.running.store import ResultStore

IDENTITY = config_from_options({"model": "tiny-bert", "dataset": "demo"}).identity()


def sample(index: int) -> dict:
    return {"index": index, "reference": [f"private text {index}"], "prediction": ["x"]}


def store(out) -> ResultStore:
    return ResultStore(out, IDENTITY)


def partial_lines(out) -> list[str]:
    return out.with_name(out.name + ".partial.jsonl").read_text(encoding="utf-8").splitlines()


def test_inputs_kept_one_per_line_and_the_record_written_whole(tmp_path):
    out = tmp_path / "run.json"
    first = store(out)
    assert first.load_finished() == {}
    first.start()
    first.append(sample(0))
    first.append(sample(1))
    assert store(out).load_finished() == {0: sample(0), 1: sample(1)}
    first.finish({"samples": [sample(0), sample(1)]})
    assert json.loads(out.read_text(encoding="utf-8")) == {"samples": [sample(0), sample(1)]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no partial, no lock


def test_resume_cuts_a_torn_last_line_before_appending(tmp_path):
    """A kill while a sample was written leaves half a line: the resumed run drops it (that
    input is attacked again) and its next sample starts on a line of its own."""
    out = tmp_path / "run.json"
    first = store(out)
    first.start()
    first.append(sample(0))
    first.append(sample(1))
    del first  # the run was killed
    partial = out.with_name("run.json.partial.jsonl")
    with partial.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(sample(2))[:25])  # the kill
    resumed = store(out)
    assert resumed.load_finished() == {0: sample(0), 1: sample(1)}
    resumed.start()
    resumed.append(sample(2))
    resumed.append(sample(3))
    lines = partial_lines(out)
    assert len(lines) == 5 and all(json.loads(line) for line in lines)
    assert store(out).load_finished() == {i: sample(i) for i in range(4)}


@pytest.mark.parametrize(
    "text",
    ['{"config": {"scenario": {"mod', "not json at all\n", "[1, 2]\n", '"text"\n{"index": 0}\n'],
)
def test_a_torn_or_unreadable_header_is_a_one_line_error(tmp_path, text):
    out = tmp_path / "run.json"
    out.with_name("run.json.partial.jsonl").write_text(text, encoding="utf-8")
    with pytest.raises(GradleakError) as caught:
        store(out).load_finished()
    message = str(caught.value)
    assert "\n" not in message and "run.json.partial.jsonl" in message
    assert message.endswith("delete it or choose another --out")


def test_a_second_run_on_the_same_out_fails_at_once(tmp_path):
    """A run in another thread holds the files: a second store neither reads on as if it
    could resume nor starts; once the first is done, the files are free again."""
    out = tmp_path / "run.json"
    first = store(out)
    started = threading.Event()

    def run_elsewhere():
        first.load_finished()
        first.start()
        first.append(sample(0))
        started.set()

    thread = threading.Thread(target=run_elsewhere)
    thread.start()
    thread.join()
    assert started.is_set()
    second = store(out)
    for step in (second.load_finished, second.start):
        with pytest.raises(GradleakError, match=r"another run is writing .*run\.json") as caught:
            step()
        assert "\n" not in str(caught.value)
    assert partial_lines(out)[1:] == [json.dumps(sample(0))]  # untouched
    first.finish({"samples": [sample(0)]})
    again = store(out)
    assert again.load_finished() == {}
    again.start()
    again.append(sample(0))
    again.finish({"samples": [sample(0)]})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_run_in_another_process_holds_the_out(tmp_path):
    out = tmp_path / "run.json"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "started"
        with pytest.raises(GradleakError, match="another run is writing"):
            store(out).start()
    finally:
        holder.communicate("go on\n", timeout=60)
    assert holder.returncode == 0
    resumed = store(out)
    assert resumed.load_finished() == {0: {"index": 0}}
    resumed.start()  # free again once that process ended
    resumed.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json.partial.jsonl"]


HOLD = """
import sys
from gradleak.config.options import config_from_options
from gradleak.running.store import ResultStore

identity = config_from_options({"model": "tiny-bert", "dataset": "demo"}).identity()
store = ResultStore(sys.argv[1], identity)
store.start()
store.append({"index": 0})
print("started", flush=True)
sys.stdin.readline()
"""


def test_a_run_of_this_thread_that_never_finished_does_not_block_the_next(tmp_path):
    """An interrupted run whose store is still referenced (a notebook keeps the traceback):
    the next run in the same thread resumes its files."""
    out = tmp_path / "run.json"
    interrupted = store(out)
    interrupted.start()
    interrupted.append(sample(0))
    resumed = store(out)
    assert resumed.load_finished() == {0: sample(0)}
    resumed.start()
    resumed.append(sample(1))
    resumed.finish({"samples": [sample(0), sample(1)]})
    del interrupted  # its end releases nothing it no longer holds
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_an_out_that_cannot_be_written_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(GradleakError, match=r"^cannot write .*a-file.*: \S") as caught:
        store(blocker / "run.json").start()
    assert "\n" not in str(caught.value)


def test_a_finalizer_run_while_this_thread_holds_the_guard_does_not_hang(tmp_path):
    """Garbage collection runs a collected store's finalizer at any allocation, also inside
    another store's start while this thread holds the guard of the process's holds (a
    FileLock's constructor allocates): the finalizer must get through, not wait on itself."""
    held = store(tmp_path / "run.json")
    held.start()
    key = store_module._key(held.lock_path)
    done = threading.Event()

    def collect_inside_the_guard():
        with store_module._HOLDS_GUARD:
            store_module._let_go(key, held._token)
        done.set()

    thread = threading.Thread(target=collect_inside_the_guard, daemon=True)
    thread.start()
    thread.join(10)
    assert done.is_set()
    assert key not in store_module._HOLDS
    again = store(tmp_path / "run.json")
    again.start()  # the lock was let go
    again.close()
