"""``--backend ray``: a run's inputs on Ray actors (a real local Ray instance, started once for
the module), with results equal to a run in one process, a killed worker restarted and its
block attacked again, and one-line errors."""

from __future__ import annotations

import os
import threading

import pytest

if os.environ.get("GRADLEAK_REQUIRE_RAY") == "1":
    import ray  # CI: the extra must be installed; its absence fails
else:
    ray = pytest.importorskip(
        "ray", reason="the ray extra is not installed: pip install 'gradleak[ray]'"
    )

import gradleak  # noqa: E402
from gradleak.errors import GradleakError  # noqa: E402
from gradleak.running.distributed import NAMESPACE, ray_session, worker_name  # noqa: E402

# DLG on the tiny BERT: about a second an input, enough for a worker to be killed mid-block.
OPTIONS = {
    "model": "tiny-bert",
    "attack": "dlg",
    "steps": 60,
    "n_inputs": 6,
    "batch_size": 1,
    "mode": "eval",
    "seed": 0,
}


@pytest.fixture(scope="module")
def local_ray():
    with ray_session():
        yield


@pytest.fixture(scope="module")
def one_process():
    return gradleak.attack(progress=False, workers=1, threads=1, **OPTIONS)


def predictions(record):
    return [(s.index, s.prediction) for s in record.samples]


@pytest.mark.slow
def test_ray_actors_give_the_one_process_record_even_when_a_worker_is_killed(
    local_ray, one_process
):
    killed = threading.Event()

    def kill_first_worker(done, total, sample):
        if not killed.is_set():  # the first result: both workers are busy with their next
            killed.set()
            ray.kill(ray.get_actor(worker_name(0), namespace=NAMESPACE), no_restart=False)

    record = gradleak.attack(
        progress=kill_first_worker, workers=2, threads=1, stack=1, backend="ray", **OPTIONS
    )
    assert killed.is_set()  # restarted, and the block it held attacked again
    assert record.backend == "ray" and record.workers == 2 and record.torch_threads == 1
    assert predictions(record) == predictions(one_process)
    assert record.metrics == one_process.metrics


class Interrupt(Exception):
    pass


@pytest.mark.slow
def test_an_interrupted_ray_run_resumes_from_its_store(local_ray, one_process, tmp_path):
    out = tmp_path / "record.json"

    def stop_after_two(done, total, sample):
        if done == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        gradleak.attack(
            progress=stop_after_two,
            workers=2,
            threads=1,
            stack=1,
            backend="ray",
            out=out,
            **OPTIONS,
        )
    partial = tmp_path / "record.json.partial.jsonl"
    assert len(partial.read_text().splitlines()) == 1 + 2  # the header and the two finished
    reported = []
    again = gradleak.attack(
        progress=lambda done, total, sample: reported.append(sample["index"]),
        workers=2, threads=1, stack=1, backend="ray", out=out, **OPTIONS,
    )  # fmt: skip
    assert len(reported) == 6 and len(set(reported)) == 6
    assert predictions(again) == predictions(one_process)


def test_workers_the_ray_cluster_cannot_hold_are_one_line_not_a_wait(local_ray):
    cpus = int(ray.cluster_resources()["CPU"])
    with pytest.raises(GradleakError, match=f"need {2 * cpus} CPUs, and the Ray cluster has"):
        gradleak.attack(progress=False, workers=2, threads=cpus, backend="ray", **OPTIONS)


def test_an_unknown_backend_is_one_line():
    with pytest.raises(GradleakError, match="unknown backend 'dask': use processes or ray"):
        gradleak.attack(progress=False, backend="dask", **OPTIONS)
