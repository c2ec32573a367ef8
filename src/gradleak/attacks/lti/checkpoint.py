"""Trained inversion models on disk: safetensors files keyed by what they were trained for.

A model is only valid for the update it was trained to read: the same global weights, task,
known template and labels, client mode, public defenses, update tensors, hashing and head, and
the same training data and budget. Those facts are the checkpoint's key; its digest names the
cache file (``$GRADLEAK_CACHE_DIR/lti/DIGEST.safetensors``), so a later run with the same key
loads the model instead of training it again, and a checkpoint given explicitly is refused,
naming the first fact that differs, when its key is another.

A cache entry is trained under a lock (:func:`exclusive`): a second run that needs the same
model waits for the first and loads what it saved, rather than training it again beside it.
The lock's holder removes the partial files a killed save of the entry left behind.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout
from safetensors import safe_open
from safetensors.torch import save_file

from gradleak.errors import GradleakError
from gradleak.models.cache import cache_dir, digest, lock_path


def cached_path(key: dict[str, Any]) -> Path:
    return cache_dir() / "lti" / f"{digest(key)}.safetensors"


def save(path: Path, state: dict[str, torch.Tensor], key: dict[str, Any], info: dict) -> None:
    """Write a checkpoint atomically (a reader sees the old file or the whole new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    try:
        save_file(tensors, str(partial),
                  metadata={"key": json.dumps(key), "info": json.dumps(info)})  # fmt: skip
        with open(partial, "rb") as handle:  # on the disk before it takes the name
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        with suppress(OSError):
            partial.unlink()
        raise


@contextmanager
def exclusive(path: Path, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the cache entry ``path`` while it is looked up and trained: another holder (a
    process, or a thread) waits until this one is done, calling ``waiting`` first. Once held,
    the partial files of the entry and of its training snapshot are removed: only a holder
    writes them, so any found were left by a save that was killed."""
    lock = FileLock(lock_path(path), thread_local=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock.acquire(blocking=False)
        except Timeout:
            if waiting is not None:
                waiting()
            lock.acquire()
    except OSError as exc:
        raise GradleakError(
            f"cannot use the inversion-model cache {path.parent} ({exc.strerror or exc}): set "
            "GRADLEAK_CACHE_DIR to a folder you can write"
        ) from None
    try:
        for stale in path.parent.glob(f".{path.stem}.*.partial"):
            with suppress(OSError):
                stale.unlink()
        yield
    finally:
        lock.release()


def load(path: Path, key: dict[str, Any] | None) -> tuple[dict[str, torch.Tensor], dict]:
    """A checkpoint's tensors and info; with ``key``, refused unless trained for it."""
    if not path.is_file():
        raise GradleakError(f"no inversion-model checkpoint at {path}: train one (drop the path)")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            state = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except Exception as exc:  # noqa: BLE001  a foreign or damaged file: one line
        raise GradleakError(f"{path} is not an inversion-model checkpoint ({exc})") from None
    if "key" not in metadata:
        raise GradleakError(f"{path} is not an inversion-model checkpoint (no key in it)")
    stored = json.loads(metadata["key"])
    if key is not None and stored != key:
        field = next(k for k in sorted(set(key) | set(stored)) if key.get(k) != stored.get(k))
        raise GradleakError(
            f"{path} was trained for another {field} ({_short(stored.get(field))}, this update "
            f"needs {_short(key.get(field))}): train one for this scenario (drop the checkpoint)"
        )
    return state, json.loads(metadata.get("info", "{}"))


def unreadable(path: Path, key: dict[str, Any] | None) -> str | None:
    """Why ``path`` cannot be loaded as a checkpoint trained for ``key``, from its header
    alone (a torn file fails here: its header names more bytes than it holds); None when it
    can."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        stored = json.loads(metadata["key"])
    except KeyError:
        return "no key in it"
    except Exception as exc:  # noqa: BLE001  a foreign or damaged file
        return str(exc)
    return None if key is None or stored == key else "trained for another key"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
