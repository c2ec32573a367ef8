"""The machine and library versions a result was produced with (recorded in every result)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from gradleak.errors import OutOfMemoryError

_LIBRARIES = ("gradleak", "torch", "transformers", "peft", "rouge-score", "scipy", "numpy")


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in _LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def machine() -> dict[str, object]:
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        **({"cuda_devices": _cuda_devices()} if torch.cuda.is_available() else {}),
    }


def _cuda_devices() -> list[str]:
    """The names of the CUDA devices torch sees (a GPU run's record says which card)."""
    import torch

    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


# What torch's allocators say when a tensor does not fit: the CPU allocator raises a plain
# RuntimeError, CUDA's and MPS's their own (``torch.OutOfMemoryError`` is a RuntimeError).
_NO_MEMORY = ("can't allocate memory", "out of memory")


@contextmanager
def out_of_memory_named(what: str, fix: str) -> Iterator[None]:
    """Raise a step's running out of memory as one line naming ``what`` ran out and ``fix``
    (:class:`~gradleak.errors.OutOfMemoryError`), not as the allocator's traceback."""
    try:
        yield
    except OutOfMemoryError:  # already named by an inner step
        raise
    except (MemoryError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and not any(m in str(exc) for m in _NO_MEMORY):
            raise
        raise OutOfMemoryError(f"{what} ran out of memory: {fix}") from None


def reset_peak_memory() -> None:
    """Start a new peak-memory window (Linux: the kernel's VmHWM); elsewhere a no-op, and
    :func:`peak_memory_mb` then reports the process's peak so far."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
    except OSError:
        pass


def peak_memory_mb() -> float | None:
    """Peak resident memory of this process, in MiB, since :func:`reset_peak_memory` where the
    platform supports resetting it (Linux), else since the process started; None if unknown.

    Resident memory is what a user's machine must hold: weights, activations, the prior and
    the allocator's cache together."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
