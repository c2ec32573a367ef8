"""The machine and library versions a result was produced with (recorded in every result)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

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
    }
