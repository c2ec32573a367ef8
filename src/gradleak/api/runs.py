"""One attack run from Python, exactly what ``gradleak attack`` does: :func:`attack`.

Bad input raises :class:`~gradleak.errors.GradleakError` (or a subclass) with the one line the
CLI prints; notices go through :mod:`warnings` (category :class:`GradleakNotice`). The
caller's objects and torch's global state (random state, threads, default dtype) are left as
they were.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gradleak.config import RunConfig
from gradleak.config.options import (
    RUN_KEYWORDS,
    all_options,
    config_from_options,
    options_of,
    unknown_name,
)
from gradleak.errors import GradleakNotice, OptionError
from gradleak.running.record import Record
from gradleak.runtime.progress import progress_bar
from gradleak.scenario.checks import check_scenario

if TYPE_CHECKING:
    from gradleak.running import runner
    from gradleak.running.plan import RunPlan


def attack(
    config: RunConfig | Mapping[str, Any] | None = None,
    *,
    out: str | Path | None = None,
    progress: bool | runner.Progress = True,
    workers: int | None = None,
    threads: int | None = None,
    device: str | None = None,
    stack: int | str | None = None,
    backend: str = "processes",
    ray_address: str | None = None,
    on_plan: Callable[[RunPlan], None] | None = None,
    **options: Any,
) -> Record:
    """Run one attack over a scenario's inputs and return its record: ``gradleak attack``.

    How the run uses the machine (its worker processes, their threads, the inputs optimized
    together) is planned from the inputs, the cores and the device unless given
    (:mod:`gradleak.running.plan`); the record keeps the plan (``record.plan``), and the same
    config, seed and plan give the same record on CPU (:func:`replay` runs a record again).

    Args:
        config: A :class:`RunConfig` (or its JSON/YAML form) to start from; options given
            beside it override its values.
        out: Write the JSON record there, and resume an interrupted run of the same config
            from it.
        progress: A progress bar on stderr (a widget in Jupyter), False for none, or a
            function ``(done, total, sample)`` called after each input.
        workers: Inputs attacked at once in separate processes (None: planned; 1: this
            process only).
        threads: Torch CPU threads of each process of the run (restored after; None:
            planned: an equal share of the cores for several workers, else as they are).
        device: Where the model, the clients' rounds and the attack compute: ``cpu`` (None:
            the default), ``cuda``, ``cuda:N`` or ``mps``.
        stack: Inputs whose updates an optimization attack optimizes together in one batched
            pass (a number, or ``"auto"``; None: planned; 1: one by one; results as one by
            one up to the order of floating-point sums).
        backend: What runs the workers: ``processes`` (local) or ``ray`` (Ray actors).
        ray_address: With ``backend="ray"``, the cluster to join (None: a local Ray instance,
            started for the run and stopped after).
        on_plan: Called with the run's :class:`~gradleak.running.plan.RunPlan` once it is
            chosen, before any input is attacked (the command line prints it).
        **options: ``gradleak attack``'s option names with underscores (``model="minilm",
            dataset="file:notes.jsonl", attack="dager", batch_size=4, n_inputs=2,
            mode="eval", seed=0``; None: not given).

    Returns:
        The run's :class:`~gradleak.running.record.Record`, as ``out`` holds it.

    Raises:
        OptionError: An unknown option, or an invalid value for one (or for ``config``).
        GradleakError: Any other bad input (an unknown model, missing data, a batch larger
            than the dataset, an attack that cannot apply), with the line the CLI prints.
        MissingDependencyError: ``backend="ray"`` without Ray installed.
    """
    run_config = _merged_config(config, options)
    check_scenario(run_config)  # before torch and the model load: bad input answers at once
    from gradleak.running import runner
    from gradleak.running.distributed import backend_session
    from gradleak.runtime.state import kept_global_state

    path = None if out is None else str(out)
    with (
        kept_global_state(threads),
        backend_session(backend, ray_address),
        _reporter(progress, run_config) as report,
    ):
        record = runner.run(
            run_config,
            out=path,
            progress=report,
            workers=workers,
            device=device or "cpu",
            stack=stack,
            backend=backend,
            ray_address=ray_address,
            threads=threads,
            on_plan=on_plan,
        )
    for notice in record.notices:
        warnings.warn(notice, GradleakNotice, stacklevel=2)
    errors = [s.error for s in record.samples if s.failed]
    if errors and len(errors) == len(record.samples):
        warnings.warn(f"no input could be attacked: {errors[0]}", GradleakNotice, stacklevel=2)
    return record


@contextlib.contextmanager
def _reporter(
    progress: bool | runner.Progress, config: RunConfig
) -> Iterator[runner.Progress | None]:
    """The runner's progress callback: a bar (True), none (False), or the caller's own."""
    if progress is not True:
        yield progress or None
        return
    description = f"{config.attack.name} on {config.scenario.model}"
    with progress_bar(description, config.scenario.data.n_inputs) as advance:
        yield lambda done, total, _sample: advance(done, total)


def _merged_config(
    config: RunConfig | Mapping[str, Any] | None, options: Mapping[str, Any]
) -> RunConfig:
    """The config to run: ``config`` with ``options`` (flat names) over it."""
    table = all_options()
    for name in options:
        if name not in table:
            raise OptionError(unknown_name(name, [*table, *RUN_KEYWORDS]))
    given = {name: value for name, value in options.items() if value is not None}
    if config is None:
        return config_from_options(given)
    if not isinstance(config, RunConfig):
        try:
            config = RunConfig.model_validate(config)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise OptionError(f"invalid config at {where}: {first['msg']}") from None
    if not given:
        return config
    base = options_of(config)
    if given.get("attack", config.attack.name) != config.attack.name:  # its settings go too
        base = {name: value for name, value in base.items() if not table[name].attacks}
    return config_from_options(base | given)


def replay(
    record: Record | str | Path,
    *,
    out: str | Path | None = None,
    progress: bool | runner.Progress = True,
) -> Record:
    """Run a record's config again with its plan: on the same kind of machine (a CPU) the
    same record comes back, up to timings.

    Args:
        record: A :class:`Record`, or the path of one (``gradleak attack --out``).
        out: Write the new record there (and resume it from there).
        progress: As for :func:`attack`.

    Returns:
        The new run's record.

    Raises:
        GradleakError: The record cannot be read, or its config cannot run here.
    """
    if not isinstance(record, Record):
        record = Record.load(record)
    options = {**plan_of(record).options(), "threads": record.torch_threads}  # its own count
    return attack(record.config, out=out, progress=progress, **options)


def plan_of(record: Record) -> RunPlan:
    """The plan a record ran with (for a record from before runs were planned: its workers,
    threads, device and largest stack)."""
    from gradleak.running.plan import RunPlan

    if record.plan is not None:
        return record.plan
    stacked = max((s.stacked for s in record.scored), default=1)
    return RunPlan(workers=record.workers, threads=record.torch_threads, stack=stacked,
                   device=record.device, backend=record.backend, cores=0)  # fmt: skip
