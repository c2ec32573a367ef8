"""gradleak: how much private text leaks from federated fine-tuning updates.

The public API (``gradleak attack`` is made of it)::

    import gradleak

    record = gradleak.run(model="minilm", attack="dager", batch_size=2, mode="eval")
    model, tokenizer = gradleak.load_model("minilm")
    update = gradleak.client_update(model, tokenizer, ["a private note"], [1], mode="eval")
    found = gradleak.invert(update, model, tokenizer, "dager")
    gradleak.score(["a private note"], found.texts).strict.exact_match

Grids of runs, their reports and a practitioner's audit are submodules (``gradleak run``,
``gradleak report``, ``gradleak audit`` are made of them)::

    from gradleak.experiments import run_experiment
    from gradleak.reports import write_report
    from gradleak.audit import run_audit

    write_report(run_experiment("configs/papers/dager-encoder.yaml").folder)
    print(run_audit("configs/audit/demo.yaml", budget_s=600).verdict)

Your own attack or defense subclasses ``Attack`` or ``Defense`` (``gradleak.defenses`` has
the stage classes) and is registered with ``register_attack`` / ``register_defense``, or, from
an installed package, through the entry points ``gradleak.attacks`` / ``gradleak.defenses``.

Every name below is documented where it is defined; bad input raises ``GradleakError``.
"""

import os

# Large CPU tensors on transparent huge pages (PyTorch's THP_MEM_ALLOC_ENABLE, read once, at the
# process's first allocation). The attacks allocate and free hundreds of MB per step (LTI's
# training: per-example gradients, vocabulary-wide logits); on 4 KiB pages the kernel's page
# faults took as much time as the arithmetic (measured: a training job's system time 411 s
# beside 455 s of user time). A THP_MEM_ALLOC_ENABLE already set, 0 included, wins.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

# A waiting OpenMP thread (torch's CPU threads: GNU libgomp) spins 300,000 times by default before
# it sleeps. Where other processes share the cores (a second run, a benchmark worker, a busy
# laptop) the spinning thread holds the core that the thread it waits for needs: 30 steps of TAG
# on the demo sentences, 2 threads beside two busy 1-thread processes on 2 cores, took 224 s;
# with 1,000 spins 15 s (sleeping at once, OMP_WAIT_POLICY=PASSIVE, 12 s). On idle cores 1,000
# spins and the default took the same time (17-19 s for 60 steps, alternated), where PASSIVE was
# 45% slower. Read once, when torch loads libgomp; a GOMP_SPINCOUNT or OMP_WAIT_POLICY already
# set wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")

__version__ = "0.1.0"

from gradleak.api import (  # noqa: E402  (the modules below read __version__)
    Reconstruction,
    client_update,
    invert,
    load_model,
    run,
    score,
)
from gradleak.attacks import Attack, AttackSettings  # noqa: E402
from gradleak.config import RunConfig  # noqa: E402
from gradleak.defenses import Defense, DefenseSettings  # noqa: E402
from gradleak.errors import (  # noqa: E402
    GradleakError,
    GradleakNotice,
    MissingDependencyError,
    OptionError,
    UpdateMismatchError,
)
from gradleak.extend import register_attack, register_defense  # noqa: E402
from gradleak.record import Metrics, Record, load_record  # noqa: E402
from gradleak.update import Update  # noqa: E402

__all__ = [
    "Attack",
    "AttackSettings",
    "Defense",
    "DefenseSettings",
    "GradleakError",
    "GradleakNotice",
    "Metrics",
    "MissingDependencyError",
    "OptionError",
    "Reconstruction",
    "Record",
    "RunConfig",
    "Update",
    "UpdateMismatchError",
    "__version__",
    "client_update",
    "invert",
    "load_model",
    "load_record",
    "register_attack",
    "register_defense",
    "run",
    "score",
]
