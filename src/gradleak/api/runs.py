"""One attack run from Python, exactly what ``gradleak attack`` does: :func:`attack`.

Bad input raises :class:`~gradleak.errors.GradleakError` (or a subclass) with the one line the
CLI prints; notices go through :mod:`warnings` (category :class:`GradleakNotice`). The
caller's objects and torch's global state (random state, threads, default dtype) are left as
they were.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
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


def attack(
    config: RunConfig | Mapping[str, Any] | None = None,
    *,
    out: str | Path | None = None,
    progress: bool | runner.Progress = True,
    workers: int = 1,
    threads: int | None = None,
    device: str | None = None,
    stack: int | str = 1,
    backend: str = "processes",
    ray_address: str | None = None,
    **options: Any,
) -> Record:
    """Run one attack over a scenario's inputs and return its record: ``gradleak attack``.

    The same config, seed, threads and stack give the same record on CPU.

    Args:
        config: A :class:`RunConfig` (or its JSON/YAML form) to start from; options given
            beside it override its values.
        out: Write the JSON record there, and resume an interrupted run of the same config
            from it.
        progress: A progress bar on stderr (a widget in Jupyter), False for none, or a
            function ``(done, total, sample)`` called after each input.
        workers: Inputs attacked at once in separate processes.
        threads: Torch CPU threads for this run (restored after; None: as they are).
        device: Where the model, the clients' rounds and the attack compute: ``cpu`` (None:
            the default), ``cuda``, ``cuda:N`` or ``mps``.
        stack: Inputs whose updates an optimization attack optimizes together in one batched
            pass (a number, or ``"auto"``; results as one by one up to rounding).
        backend: What runs the workers: ``processes`` (local) or ``ray`` (Ray actors).
        ray_address: With ``backend="ray"``, the cluster to join (None: a local Ray instance,
            started for the run and stopped after).
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
