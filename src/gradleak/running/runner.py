"""Running a config over its inputs: resume from what is stored, attack the rest (here or in
worker processes), report progress, and assemble the typed record."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

import torch

from gradleak.attacks import ATTACKS
from gradleak.attacks.base import Attack
from gradleak.config import RunConfig
from gradleak.defenses import DEFENSES
from gradleak.errors import GradleakError
from gradleak.running.cost import input_seconds
from gradleak.running.distributed import attack_on_ray, check_backend
from gradleak.running.plan import RunPlan, Workload, plan_run
from gradleak.running.recipe import Prepared, attack_inputs, describe_scenario, prepare
from gradleak.running.record import Provenance, Record, public_sample, summarize
from gradleak.running.store import Results, ResultStore
from gradleak.runtime.devices import resolve_device
from gradleak.runtime.environment import machine, versions
from gradleak.runtime.tuning import children_tuned
from gradleak.version import __version__

# Called after every finished input: (inputs done, inputs wanted, the stored sample).
Progress = Callable[[int, int, dict[str, Any]], None]
# Processes (or Ray actors) attacking at once: each holds a model and an attack, so more than
# a large machine's cores (or a cluster's actors) only queue; a slip such as 10000 would
# start that many processes.
MAX_WORKERS = 256


def run(
    config: RunConfig,
    out: str | None = None,
    progress: Progress | None = None,
    limit: int | None = None,
    workers: int | None = 1,
    device: torch.device | str = "cpu",
    store: Results | None = None,
    stack: int | str | None = 1,
    backend: str = "processes",
    ray_address: str | None = None,
    threads: int | None = None,
    on_plan: Callable[[RunPlan], None] | None = None,
) -> Record:
    """Run ``config`` and return its record (also written to ``out`` when given).

    ``limit`` stops after the first ``limit`` inputs: the record then covers only those, and
    ``out`` keeps them as a part-way run that a later call resumes (a long table can be filled
    a few inputs per cell at a time, every cell comparable, none redone).

    ``workers``, ``threads`` and ``stack`` are the run's plan (:mod:`gradleak.running.plan`):
    None plans that part from the inputs, the cores and the device, and ``on_plan`` hears the
    plan before any input is attacked. ``workers`` > 1 attacks that many inputs at once in
    separate processes (see :func:`attack_in_workers`), at most :data:`MAX_WORKERS`, each with
    ``threads`` torch threads (None: an equal share of this process's).

    ``device`` is where the model, the clients' rounds and the attack compute (``cpu``,
    ``cuda``, ``cuda:N``, ``mps``); a part-way run resumes only on the device it began on.

    ``store`` keeps the finished inputs and the record somewhere else than ``out``'s files
    (an experiment's database); it replaces ``out``.

    ``stack`` > 1 hands the attack that many inputs at a time, which an optimization attack
    optimizes together in one stacked pass (each input's result is its one-by-one result up
    to floating-point summation order); ``"auto"`` lets :func:`stack_size` pick from the
    machine and the inputs' lengths. Which inputs share a stack does not depend on which are
    done (:func:`stack_blocks`), so a resumed run stacks as the first one did."""
    if limit is not None and limit < 1:
        raise GradleakError(f"limit must be at least 1 input, got {limit}")
    if workers is not None and workers < 1:
        raise GradleakError(f"workers must be at least 1 (1: one input at a time), got {workers}")
    if workers is not None and workers > MAX_WORKERS:
        raise GradleakError(
            f"workers must be at most {MAX_WORKERS} (each is a process holding the model), "
            f"got {workers}"
        )
    stack = None if stack is None else requested_stack(stack)
    check_backend(backend)
    total_start = time.perf_counter()
    device = resolve_device(device)
    if store is None:
        store = ResultStore(out, config.identity(), str(device))
    finished = store.load_finished()
    prepared = prepare(config, device)
    store.start()
    wanted = range(len(prepared.batches[:limit]))
    done = {i: finished[i] for i in wanted if i in finished}
    for count, index in enumerate(sorted(done), 1):
        if progress:
            progress(count, len(wanted), done[index])
    plan = plan_run(
        workload(config, prepared, len(wanted)),
        str(device),
        workers=workers,
        threads=threads,
        stack=stack,
        backend=backend,
        auto_stack=lambda count: stack_size("auto", prepared, device, len(wanted), count),
    )
    if on_plan is not None:
        on_plan(plan)
    blocks = [
        block
        for whole in stack_blocks(prepared, len(wanted), plan.stack)
        if (block := [i for i in whole if i not in done])
    ]
    on_ray = backend == "ray" and bool(blocks)
    parallel = on_ray or (plan.workers > 1 and len(blocks) > 1)
    workers = plan.workers
    threads = (plan.threads or worker_threads(workers)) if parallel else torch.get_num_threads()
    if parallel:
        check_workers_can_build(config)
        # each worker loads its own prior: this process's copy would only hold memory
        prepared.attack.release()
        # the longest blocks first: the workers then end close together (blocks and results
        # are the same in any order)
        tokens = input_tokens(prepared)
        blocks.sort(key=lambda block: -sum(tokens[i] for i in block))
        if on_ray:
            new_samples = attack_on_ray(config, blocks, workers, threads, str(device), ray_address)
        else:
            new_samples = attack_in_workers(config, blocks, workers, device, threads)
    else:
        new_samples = (s for block in blocks for s in attack_inputs(config, prepared, block))
    for sample in new_samples:
        store.append(sample)
        done[sample["index"]] = sample
        if progress:
            progress(len(done), len(wanted), sample)
    samples = [done[i] for i in wanted]
    total_s = time.perf_counter() - total_start
    record = build_record(
        config, prepared, samples, total_s, threads, workers if parallel else 1, str(device),
        backend if on_ray else "processes", plan,
    )  # fmt: skip
    if len(samples) == len(prepared.batches):
        store.finish(record.to_json())
    return record


def workload(config: RunConfig, prepared: Prepared, inputs: int) -> Workload:
    """What the plan is chosen for: ``inputs`` of this run's, their rough cost, and what a
    worker would hold."""
    attack = prepared.attack
    return Workload(
        inputs=inputs,
        seconds_per_input=input_seconds(config),
        stacks=type(attack).run_many is not Attack.run_many,
        attack=config.attack.name,
        model_parameters=sum(p.numel() for p in prepared.victim.model.parameters()),
        held_parameters=attack.held_parameters(),
    )


def stacking_notice(samples: list[dict[str, Any]]) -> list[str]:
    """The record's line where inputs were optimized together: equal to one by one up to the
    order of floating-point sums."""
    most = max((s.get("stacked", 1) for s in samples), default=1)
    if most <= 1:
        return []
    return [
        f"up to {most} inputs were optimized together in one stacked pass (--stack): each "
        "input's result is its one-by-one result up to the order of floating-point sums"
    ]


# --- stacking ----------------------------------------------------------------------------------
# Tokens per stacked pass that ``stack="auto"`` aims for: on a CPU a step's cost per sequence
# stops falling beyond about this (docs/design/optimization-speed.md), and more only delays
# the first stored result. A GPU needs far more rows to fill it.
AUTO_STACK_TOKENS = {"cpu": 128, "cuda": 2048}
MAX_AUTO_STACK = 16


def requested_stack(stack: int | str) -> int | str:
    """``stack`` checked: a number of inputs (at least 1) or ``"auto"``."""
    if stack == "auto":
        return stack
    if isinstance(stack, str):
        if not stack.isdigit():
            raise GradleakError(f"stack must be a number of inputs or 'auto', got '{stack}'")
        stack = int(stack)
    if stack < 1:
        raise GradleakError(f"stack must be at least 1 input (1: one at a time), got {stack}")
    return stack


def stack_size(
    stack: int | str,
    prepared: Prepared,
    device: torch.device | str,
    inputs: int | None = None,
    workers: int = 1,
) -> int:
    """The inputs handed to the attack at a time: ``stack`` itself, or for ``"auto"`` as many
    as fill :data:`AUTO_STACK_TOKENS` with the inputs' mean token count (1 for an attack that
    attacks updates one by one anyway), and no more than leave each of ``workers`` two blocks
    of the run's ``inputs``: one block per worker would leave the worker with the long inputs
    running alone long after the other."""
    stack = requested_stack(stack)
    if stack == "auto":
        if type(prepared.attack).run_many is Attack.run_many:
            return 1
        tokens = input_tokens(prepared)
        per_input = max(1.0, sum(tokens) / max(1, len(tokens)))
        budget = AUTO_STACK_TOKENS.get(torch.device(device).type, AUTO_STACK_TOKENS["cpu"])
        size = min(MAX_AUTO_STACK, int(budget // per_input))
        if inputs is not None and workers > 1:
            size = min(size, -(-inputs // (2 * workers)))
        return max(1, size)
    return stack


def input_tokens(prepared: Prepared) -> list[int]:
    """Each input's padded size in tokens (:attr:`Prepared.input_tokens`)."""
    return prepared.input_tokens


def stack_blocks(prepared: Prepared, count: int, size: int) -> list[list[int]]:
    """The first ``count`` inputs in blocks of ``size`` handed to the attack together: in
    order of their token count (a stack pads every input to its longest, so similar lengths
    waste least), each block in index order. The blocks depend only on the inputs, never on
    which of them a part-way run has done."""
    if size == 1:
        return [[index] for index in range(count)]
    tokens = input_tokens(prepared)[:count]
    order = sorted(range(count), key=lambda index: (tokens[index], index))
    return [sorted(order[start : start + size]) for start in range(0, count, size)]


def build_record(
    config: RunConfig,
    prepared: Prepared,
    samples: list[dict[str, Any]],
    total_s: float,
    threads: int,
    workers: int = 1,
    device: str = "cpu",
    backend: str = "processes",
    plan: RunPlan | None = None,
) -> Record:
    """The record of stored samples (as ``recipe.attack_input`` returns them)."""
    dropout = prepared.victim.adapter.dropout_rate(prepared.victim.model)
    return Record(
        gradleak_version=__version__,
        config=config,
        task=prepared.task,
        scenario=describe_scenario(config, dropout),
        samples=[public_sample(s) for s in samples],
        metrics=summarize(samples),
        failed_inputs=[s["index"] for s in samples if "error" in s],
        timing={
            "total_s": total_s,
            "attack_s": sum(s["attack_s"] for s in samples),
            "update_s": sum(s.get("update_s") or 0.0 for s in samples),
            "load_s": prepared.load_s,
        },
        versions=versions(),
        machine=machine(),
        torch_threads=threads,
        workers=workers,
        backend=backend,
        device=device,
        notices=prepared.notices + stacking_notice(samples),
        provenance=provenance(config),
        plan=plan,
    )


def provenance(config: RunConfig) -> Provenance:
    """Where the config's attack and defenses come from (package and version)."""
    return Provenance(
        attack=ATTACKS.origin(config.attack.name),
        defenses={d.name: DEFENSES.origin(d.name) for d in config.scenario.defenses},
    )


# --- inputs in parallel ----------------------------------------------------------------------
# A small gradient-matching step uses two threads poorly, so two 1-thread processes attacking
# two inputs finish a table sooner than one 2-thread process. Each input's seeds derive from
# its index, so results do not depend on which worker ran it; they can differ from a run with
# another thread count per process in the last float bits (reduction order).


def check_workers_can_build(config: RunConfig) -> None:
    """A worker process finds built-in and installed attacks and defenses by name, but not
    one registered at run time in this process: say so before starting any."""
    origins = provenance(config)
    for name, origin in ((config.attack.name, origins.attack), *origins.defenses.items()):
        if origin.source == "run time":
            raise GradleakError(
                f"{name} was registered at run time, and worker processes cannot see it: use "
                "workers=1, or install it as a plugin (docs/extending.md)"
            )


def worker_threads(workers: int) -> int:
    """Torch threads of each of ``workers`` processes: an equal share, at least one."""
    return max(1, torch.get_num_threads() // workers)


class _Worker:
    """What a worker process holds: its config and what it prepared (one per process)."""

    config: RunConfig
    prepared: Prepared


def _start_worker(config: RunConfig, threads: int, parent: int, device: str) -> None:
    torch.set_num_threads(threads)
    _exit_with_parent(parent)
    _Worker.config = config
    _Worker.prepared = prepare(config, device)


def _attack_in_worker(block: list[int]) -> list[dict[str, Any]]:
    return attack_inputs(_Worker.config, _Worker.prepared, block)


def _exit_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """End this worker within ``poll_s`` of the death of ``parent`` (the run's pid, passed
    down: if the run died while this worker was still starting, it ends at once).

    A run killed outright (SIGTERM, SIGKILL, a scheduler's time limit) runs no cleanup, and its
    workers would go on attacking inputs whose results nobody will store, holding the cores."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def attack_in_workers(
    config: RunConfig,
    blocks: list[list[int]],
    workers: int,
    device: torch.device | str = "cpu",
    threads: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Attack ``blocks`` of inputs (one block per call of the attack) in ``workers`` spawned
    processes, yielding samples as each block finishes (so the store keeps them at once). Each
    worker loads the models once and runs ``threads`` torch threads (None: an equal share of
    this process's, at least one).

    An error or an interrupt stops the workers at once: the inputs they were on are lost either
    way, and waiting for them would only hold the cores."""
    threads = threads or worker_threads(workers)
    context = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools
    before = set(multiprocessing.active_children())
    with ProcessPoolExecutor(
        min(workers, len(blocks)), mp_context=context, initializer=_start_worker,
        initargs=(config, threads, os.getpid(), str(device)),
    ) as pool:  # fmt: skip
        with children_tuned():  # the processes start as they are submitted to
            futures = [pool.submit(_attack_in_worker, block) for block in blocks]
        try:
            for future in as_completed(futures):
                yield from future.result()
        except BaseException:  # an error, an interrupt, or the consumer stopped early
            pool.shutdown(wait=False, cancel_futures=True)
            stop_processes(set(multiprocessing.active_children()) - before)
            raise


def stop_processes(processes: set[multiprocessing.process.BaseProcess]) -> None:
    """End ``processes`` now: terminate, then kill what is still alive after 5 s."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()
