"""The caller's global torch state, left as it was found.

Runs seed torch's global generator (dropout masks, LoRA and head inits), may set its thread
count, and must not change what the caller's own code draws or how fast it runs afterwards:
every public entry point runs inside :func:`kept_global_state`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from gradleak.errors import OptionError


@contextlib.contextmanager
def kept_global_state(threads: int | None = None) -> Iterator[None]:
    """Run the block with ``threads`` torch CPU threads (None: as they are), then restore the
    thread count, the global CPU random state and the default dtype."""
    if threads is not None and threads < 1:
        raise OptionError(f"threads must be at least 1, got {threads}")
    saved_threads, saved_dtype = torch.get_num_threads(), torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        try:
            if threads is not None:
                torch.set_num_threads(threads)
            yield
        finally:
            if threads is not None:
                torch.set_num_threads(saved_threads)
            torch.set_default_dtype(saved_dtype)
