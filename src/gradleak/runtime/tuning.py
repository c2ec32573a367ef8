"""Process-wide settings that make torch's CPU arithmetic faster here, read once when torch
loads: so they are set where a process starts, before torch, never by importing gradleak.

* ``THP_MEM_ALLOC_ENABLE=1``: large CPU tensors on transparent huge pages (the attacks
  allocate and free hundreds of MB a step; on 4 KiB pages the page faults cost as much as
  the arithmetic);
* ``GOMP_SPINCOUNT=1000``: a waiting OpenMP thread sleeps after 1,000 spins instead of
  300,000, so it gives the core back to a process sharing it.

The command line sets them at its entry, a run's worker processes and Ray actors start with
them; a notebook or script calls :func:`tune_process` before it imports torch. A value the
user set wins, and ``OMP_WAIT_POLICY`` set by the user leaves the spin count alone.
``docs/design/cpu-tuning.md`` has the measurements behind both.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping

DEFAULTS: dict[str, str] = {"THP_MEM_ALLOC_ENABLE": "1", "GOMP_SPINCOUNT": "1000"}


def tuned_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables to add to ``environ`` (default: this process's): each default the user
    has not set (the spin count only without a user's ``OMP_WAIT_POLICY``)."""
    environ = os.environ if environ is None else environ
    added = {key: value for key, value in DEFAULTS.items() if key not in environ}
    if "OMP_WAIT_POLICY" in environ:
        added.pop("GOMP_SPINCOUNT", None)
    return added


def tune_process() -> dict[str, str]:
    """Set the tuning in this process's environment, as the command line does at its entry.

    It takes effect only before torch is imported: call it first in a script or notebook. A
    value the user set wins.

    Returns:
        The variables added, by name (empty when the user had set them all).
    """
    added = tuned_environment()
    os.environ.update(added)
    return added


def torch_loaded() -> bool:
    """Whether torch is already imported here (the tuning then no longer applies to it)."""
    return "torch" in sys.modules


@contextlib.contextmanager
def children_tuned() -> Iterator[dict[str, str]]:
    """This process's environment with the tuning added for the block, for the processes it
    starts there; restored after."""
    added = tuned_environment()
    os.environ.update(added)
    try:
        yield added
    finally:
        for key in added:
            os.environ.pop(key, None)
