"""Ray as the engine that spreads a run's inputs over processes and machines
(``--backend ray``; ``pip install 'gradleak[ray]'``).

Each worker is a Ray actor that prepares the run once (the victim, the attack's prior) and
then attacks blocks of inputs, asking Ray for as many CPUs as it has torch threads. The
driver stores each block's samples as it finishes, so an interrupted run resumes from its
store like any other; an actor that dies (a node lost, a process killed) is restarted and its
block attacked again (:data:`RETRIES`). Each input's seeds derive from its index, so results
are those of the process workers with as many threads each.

By default a local Ray instance is started (no dashboard, usage statistics off) and stopped
with the run; ``address`` joins a running cluster instead (``ray start --head`` on one machine,
``ray start --address HEAD:6379`` on the others, gradleak installed on each). A Ray instance
already running in this process (a Flower simulation's) is reused, not stopped.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from gradleak.config import RunConfig
from gradleak.errors import GradleakError, MissingDependencyError, last_line
from gradleak.running.recipe import Prepared, attack_inputs, prepare
from gradleak.runtime.tuning import tuned_environment

BACKENDS = ("processes", "ray")
# Restarts of a dead worker actor, and retries of the block it was attacking.
RETRIES = 2
NAMESPACE = "gradleak"


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise GradleakError(f"unknown backend '{backend}': use processes or ray")


def _ray() -> Any:
    """The ray module, with its usage statistics off unless the environment turns them on."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            "--backend ray needs the ray extra: pip install 'gradleak[ray]' (or make install-ray)"
        ) from None
    return ray


def backend_session(
    backend: str, address: str | None = None
) -> contextlib.AbstractContextManager[None]:
    """What a run or a grid on ``backend`` holds for its duration: Ray (see
    :func:`ray_session`), or nothing for local processes; an unknown backend is an error."""
    check_backend(backend)
    return ray_session(address) if backend == "ray" else contextlib.nullcontext()


@contextlib.contextmanager
def ray_session(address: str | None = None) -> Iterator[None]:
    """Ray for the block: joined at ``address``, or started locally; stopped after only if
    this call started it (one instance serves a whole experiment grid)."""
    ray = _ray()
    started = connect(address)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def connect(address: str | None = None) -> bool:
    """Make sure Ray is up in this process; True when this call started or joined it."""
    ray = _ray()
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {
        "include_dashboard": False,
        "namespace": NAMESPACE,
        "log_to_driver": False,
        "configure_logging": False,
    }
    if address is None:
        options["num_cpus"] = os.cpu_count() or 1
    else:
        options["address"] = address
    try:
        ray.init(**options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GradleakError(f"cannot start or join {where}: {first}") from None
    return True


class RayWorker:
    """One worker actor: the run prepared once, then blocks of inputs attacked on demand."""

    def __init__(self, config: RunConfig, threads: int, device: str) -> None:
        torch.set_num_threads(threads)
        self.config = config
        self.prepared: Prepared = prepare(config, device)

    def attack(self, block: list[int]) -> list[dict[str, Any]]:
        return attack_inputs(self.config, self.prepared, block)

    def pid(self) -> int:
        return os.getpid()


def worker_name(index: int) -> str:
    """The Ray name of worker ``index`` (in the ``gradleak`` namespace)."""
    return f"gradleak-worker-{index}"


def check_cpus(cluster_cpus: float, actors: int, threads: int) -> None:
    """Refuse actors the cluster cannot hold all at once: Ray would keep the ones that do not
    fit pending, and the blocks handed to them would wait for ever."""
    if actors * threads <= cluster_cpus:
        return
    raise GradleakError(
        f"{actors} Ray worker{'s' if actors > 1 else ''} of {threads} thread"
        f"{'s' if threads > 1 else ''} each need {actors * threads} CPUs, and the Ray cluster "
        f"has {cluster_cpus:g}: lower --workers or --threads"
    )


def attack_on_ray(
    config: RunConfig,
    blocks: list[list[int]],
    workers: int,
    threads: int,
    device: str = "cpu",
    address: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Attack ``blocks`` of inputs on ``workers`` Ray actors of ``threads`` CPUs each,
    yielding samples as each block finishes. An error or an interrupt kills the actors."""
    ray = _ray()
    from ray.util import ActorPool

    connect(address)
    actors_wanted = min(workers, len(blocks))
    check_cpus(ray.cluster_resources().get("CPU", 0), actors_wanted, threads)
    remote = ray.remote(
        num_cpus=threads,
        max_restarts=RETRIES,
        max_task_retries=RETRIES,
        runtime_env={"env_vars": tuned_environment()},  # set before the actor loads torch
    )(RayWorker)
    actors = [
        remote.options(name=worker_name(i), namespace=NAMESPACE, lifetime=None).remote(
            config, threads, device
        )
        for i in range(actors_wanted)
    ]
    pool = ActorPool(actors)
    try:
        for samples in pool.map_unordered(lambda actor, block: actor.attack.remote(block), blocks):
            yield from samples
    except ray.exceptions.RayError as exc:
        cause = getattr(exc, "cause", None) or exc
        raise GradleakError(f"a Ray worker failed: {last_line(str(cause))}") from None
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
