"""How a run uses the machine: its worker processes, the torch threads of each, and how many
inputs an optimization attack optimizes together in one pass (its stack).

The plan is chosen from what the run attacks (the attack, the model, the inputs and their
lengths, the rough cost of each: :mod:`gradleak.running.cost`), the cores this process may
use and the device, never from the machine's momentary load: the same command on the same
machine gets the same plan, and the same seed and plan give the same record on a CPU. A plan
given in part (``--workers``, ``--threads``, ``--stack``) keeps what was given and plans the
rest; ``workers=1, stack=1`` is a one-by-one run. Why these rules, with the measurements
behind them: ``docs/design/run-plan.md``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from gradleak.errors import GradleakError

# Below this many seconds of attacking in all, worker processes cost more than they save
# (each starts Python and torch and loads the model and the attack) and a plan stays in this
# process, as a run always did.
PARALLEL_FROM_SECONDS = 120.0
# Resident memory a worker needs beside its model's weights (Python, torch, the attack's
# buffers); a model's weights count four times (the weights, their gradients, the dummy
# gradients and their graph), an LM prior's once.
WORKER_BASE_BYTES = 1.5e9
BYTES_PER_PARAMETER = 16
# Workers may hold at most this share of the machine's memory.
MEMORY_SHARE = 0.6
# Attacks that load or train something big once per run (LTI's inversion model): one process,
# whatever the inputs (a second would train or load it again).
ONE_PROCESS_ATTACKS = ("lti", "lti-p")


class RunPlan(BaseModel):
    """What a run ran with: ``workers`` processes of ``threads`` torch threads each (one
    process: ``threads`` None, torch's own count), inputs handed to the attack ``stack`` at a
    time, on ``device`` through ``backend``. ``planned`` says which of them the plan chose
    (the others were given); ``why`` is the one line that said so before the run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int
    threads: int | None
    stack: int
    device: str
    backend: str = "processes"
    cores: int
    planned: tuple[str, ...] = ()
    why: str = ""

    def options(self) -> dict[str, Any]:
        """The run options that give this plan again (``gradleak.attack(**options)``)."""
        return {
            "workers": self.workers,
            "threads": self.threads,
            "stack": self.stack,
            "device": self.device,
            "backend": self.backend,
        }

    @property
    def text(self) -> str:
        """The plan in one line, for the terminal."""
        each = "" if self.threads is None else f" x {self.threads} thread"
        each += "s" if self.threads not in (None, 1) else ""
        workers = f"{self.workers} worker{'s' if self.workers > 1 else ''}{each}"
        stack = "one input a pass" if self.stack == 1 else f"{self.stack} inputs a pass"
        return f"plan: {workers}, {stack}, on {self.device} ({self.why})"


@dataclass(frozen=True)
class Workload:
    """What the plan is chosen for: the inputs still to attack, the seconds each is expected to
    take (:func:`gradleak.running.cost.input_seconds`), whether the attack can stack inputs,
    and the parameters a worker holds (the victim's and an LM prior's)."""

    inputs: int
    seconds_per_input: float
    stacks: bool
    attack: str
    model_parameters: int
    held_parameters: int = 0


def cores() -> int:
    """The CPUs this process may run on (its affinity where the platform says, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_memory() -> float | None:
    """The machine's memory in bytes (all of it, not what is free now), or None if unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def plan_run(
    work: Workload,
    device: str,
    *,
    workers: int | None = None,
    threads: int | None = None,
    stack: int | str | None = None,
    backend: str = "processes",
    available: int | None = None,
    memory: float | None = None,
    auto_stack: Any = None,
) -> RunPlan:
    """The plan for ``work`` on ``device``: what is given (``workers``, ``threads``, ``stack``)
    is kept, the rest chosen. ``available``: the cores (default: :func:`cores`); ``memory``:
    the machine's bytes (default: :func:`machine_memory`); ``auto_stack(workers)``: the stack
    ``"auto"`` gives for that many workers (the runner's, from the inputs' lengths)."""
    available = available or cores()
    memory = machine_memory() if memory is None else memory
    planned: list[str] = []
    total = work.inputs * work.seconds_per_input
    on_cpu = device == "cpu"
    reason = []
    if workers is None:
        planned.append("workers")
        workers = _planned_workers(work, available, memory, on_cpu, total, reason)
    if threads is None and workers > 1:
        planned.append("threads")
        threads = max(1, available // workers)
    if stack is None:
        planned.append("stack")
        stack = "auto" if work.stacks and (workers > 1 or not on_cpu) else 1
        if stack == "auto" and on_cpu:
            reason.append("stacks of similar lengths, two blocks a worker at least")
    if stack == "auto":
        stack = auto_stack(workers) if auto_stack is not None else 1
    if not isinstance(stack, int) or stack < 1:
        raise GradleakError(f"stack must be a number of inputs or 'auto', got {stack!r}")
    if not reason:
        reason.append("as given")
    return RunPlan(
        workers=workers,
        threads=threads,
        stack=stack,
        device=device,
        backend=backend,
        cores=available,
        planned=tuple(planned),
        why=f"{available} core{'s' if available > 1 else ''}, {work.inputs} input"
        f"{'s' if work.inputs != 1 else ''} of about {_seconds(work.seconds_per_input)}: "
        + "; ".join(reason),
    )


def _planned_workers(
    work: Workload, available: int, memory: float | None, on_cpu: bool, total: float,
    reason: list[str],
) -> int:  # fmt: skip
    """One process for a GPU, a short run, one input, one core, or an attack that loads
    something big once; else a worker a core, as many as the inputs and the memory allow."""
    if not on_cpu:
        reason.append("one process on an accelerator")
        return 1
    if work.attack in ONE_PROCESS_ATTACKS:
        reason.append(f"{work.attack} trains or loads its model once, in one process")
        return 1
    if available < 2 or work.inputs < 2:
        reason.append("one process: " + ("one core" if available < 2 else "one input"))
        return 1
    if total < PARALLEL_FROM_SECONDS:
        reason.append(f"one process: {_seconds(total)} in all, less than workers cost to start")
        return 1
    workers = min(available, work.inputs)
    if memory is not None:
        per_worker = WORKER_BASE_BYTES + BYTES_PER_PARAMETER * work.model_parameters
        per_worker += 4 * work.held_parameters
        workers = max(1, min(workers, int(MEMORY_SHARE * memory // per_worker)))
    reason.append(f"a worker a core ({workers} x 1 thread beats 1 x {available})")
    return workers


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
