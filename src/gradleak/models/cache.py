"""gradleak's cache of converted weights, and a safe way to fill it.

:func:`cached_conversion` creates a cache entry at most once however many processes ask for it
at the same time: the conversion runs under a file lock and writes into a fresh temporary
folder beside the target, which is renamed into place only when complete. A reader therefore
sees either no entry or a finished one, never a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

if TYPE_CHECKING:
    import torch

ENV_CACHE_DIR = "GRADLEAK_CACHE_DIR"
PARTIAL_SUFFIX = ".partial"


def cache_dir() -> Path:
    """Where converted weights are kept (``GRADLEAK_CACHE_DIR``, else ``~/.cache/gradleak``)."""
    return Path(os.environ.get(ENV_CACHE_DIR, Path.home() / ".cache" / "gradleak"))


def lock_path(target: Path) -> Path:
    """The lock file that guards ``target`` (a hidden file beside it)."""
    return target.with_name(f".{target.name}.lock")


def partial_dirs(target: Path) -> list[Path]:
    """Temporary folders of conversions into ``target`` that did not finish (or are running)."""
    return sorted(target.parent.glob(f".{target.name}.*{PARTIAL_SUFFIX}"))


def cached_conversion(
    target: Path,
    convert: Callable[[Path], None],
    is_complete: Callable[[Path], bool] | None = None,
) -> Path:
    """Return ``target``, first creating it with ``convert(folder)`` if it does not exist yet.

    ``convert`` writes the entry's files into the empty ``folder`` it is given; when it returns,
    the folder is renamed to ``target`` (one atomic rename in the same parent). The work runs
    under a lock on ``target``: a process that waited for the lock finds the finished entry
    and returns it without converting again. If ``convert`` raises, its folder is removed and
    the exception propagates, leaving no ``target``. Folders left by a process that was killed
    mid-conversion are removed by the next conversion. ``is_complete`` decides whether an
    existing ``target`` is usable (default: it is a folder); an unusable one is replaced.
    """
    complete = is_complete or Path.is_dir
    if complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(lock_path(target)):
        if complete(target):
            return target  # another process converted it while this one waited
        for stale in partial_dirs(target):  # only the lock holder writes these
            shutil.rmtree(stale, ignore_errors=True)
        if target.is_dir():
            shutil.rmtree(target)  # an unusable entry, e.g. from an older layout
        elif target.exists():
            target.unlink()
        work = target.with_name(f".{target.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
        work.mkdir()  # unlike mkdtemp, keeps the umask's permissions for the entry
        try:
            convert(work)
            os.replace(work, target)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return target


def digest(key: dict[str, Any]) -> str:
    """A cache entry's name: a hash of its key's canonical JSON."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def weights_digest(tensors: list[torch.Tensor]) -> str:
    """A fingerprint of the global model's weights (their bytes, in order)."""
    import torch  # here: the front door reads cache_dir without loading torch

    h = hashlib.sha256()
    for tensor in tensors:
        h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


def texts_digest(texts: list[str]) -> str:
    """A fingerprint of a list of texts (the training data)."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode("utf-8") + b"\x00")
    return h.hexdigest()[:24]
