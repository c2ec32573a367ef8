"""Results on disk: finished inputs are appended as they complete, so nothing done is lost.

``OUT.json`` is written when a run completes, whole (a kill leaves no half record); while it
runs, each finished input is one line of ``OUT.json.partial.jsonl`` (the first line holds the
config). Running the same config with the same ``--out`` again resumes after the last finished
input, cutting off a line a kill tore. A run holds ``OUT.json.lock`` while it writes: a second
run on the same ``--out`` fails at once instead of writing into the first one's files (the lock
is the operating system's, so a killed run holds nothing; its lock file is left, and ignored).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from filelock import FileLock, Timeout

from gradleak.config import RunConfig
from gradleak.errors import GradleakError
from gradleak.runtime.files import write_atomic


class Results(Protocol):
    """Where a run keeps its finished inputs and, once all are done, its record."""

    def load_finished(self) -> dict[int, dict[str, Any]]:
        """Inputs finished by an earlier run of the same config, by index."""
        ...

    def start(self) -> None:
        """Called once before the first input is attacked."""
        ...

    def append(self, sample: dict[str, Any]) -> None:
        """Keep one finished input at once (a crash after this loses nothing of it)."""
        ...

    def finish(self, record: dict[str, Any]) -> None:
        """Keep the record of a run whose inputs are all done."""
        ...


class ResultStore:
    """A run's results as JSON files beside ``out`` (see the module's docstring)."""

    def __init__(
        self, out: str | Path | None, identity: dict[str, Any], device: str = "cpu"
    ) -> None:
        self.out = Path(out) if out else None
        self.identity = identity
        self.device = device
        self.partial = self.out.with_name(self.out.name + ".partial.jsonl") if self.out else None
        self.lock_path = self.out.with_name(self.out.name + ".lock") if self.out else None
        self._token = object()  # this store's claim on the lock (see _Hold)

    def load_finished(self) -> dict[int, dict[str, Any]]:
        """Samples finished by an earlier, interrupted run of the same config."""
        if self.partial is None or not self.partial.exists():
            return {}
        self._refuse_if_busy()
        try:
            data = self.partial.read_bytes()
        except OSError as exc:
            raise GradleakError(f"cannot read {self.partial}: {_reason(exc)}") from None
        lines = data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]  # whole lines only
        if not data.strip():
            return {}
        header = _header(lines[0] if lines else b"")
        if header is None:
            raise GradleakError(
                f"{self.partial} holds an unfinished run whose first line (its config) is torn "
                "or unreadable, so it cannot be resumed: delete it or choose another --out"
            )
        if _stored_identity(header.get("config")) != self.identity:
            raise GradleakError(
                f"{self.partial} holds an unfinished run with a different config: delete it or "
                "choose another --out"
            )
        began_on = header.get("device", "cpu")  # files written before devices: the CPU
        if began_on != self.device:
            raise GradleakError(
                f"{self.partial} holds an unfinished run begun on device {began_on}: resume it "
                f"with --device {began_on} (results differ between devices), or choose another "
                "--out"
            )
        finished: dict[int, dict[str, Any]] = {}
        for line in lines[1:]:
            try:
                sample = json.loads(line)
                finished[sample["index"]] = sample
            except (ValueError, TypeError, KeyError):  # a line damaged by a crash
                continue
        return finished

    def start(self) -> None:
        """Hold ``out`` for this run (a second run on it fails at once), then begin the
        partial file, or cut an interrupted one back to its last whole line (a sample torn by
        a kill), so that the next sample starts on a line of its own."""
        if self.partial is None:
            return
        self._hold()
        try:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            data = self.partial.read_bytes() if self.partial.exists() else b""
            whole = data.rfind(b"\n") + 1
            if not data[:whole].strip():
                header = {"config": self.identity, "device": self.device}
                write_atomic(self.partial, json.dumps(header) + "\n")
            elif whole < len(data):
                with self.partial.open("r+b") as handle:
                    handle.truncate(whole)
                    handle.flush()
                    os.fsync(handle.fileno())
        except OSError as exc:
            raise GradleakError(f"cannot write {self.partial}: {_reason(exc)}") from None

    def append(self, sample: dict[str, Any]) -> None:
        if self.partial is None:
            return
        try:
            with self.partial.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(sample) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise GradleakError(f"cannot write {self.partial}: {_reason(exc)}") from None

    def finish(self, record: dict[str, Any]) -> None:
        """Write the record whole (:func:`~gradleak.runtime.files.write_atomic`), then drop
        the partial file and let go of ``out``."""
        if self.out is None:
            return
        try:
            write_atomic(self.out, json.dumps(record, indent=2) + "\n")
            if self.partial is not None:
                self.partial.unlink(missing_ok=True)
        except OSError as exc:
            raise GradleakError(f"cannot remove {self.partial}: {_reason(exc)}") from None
        finally:
            self.close()

    def close(self) -> None:
        """Let go of ``out`` without finishing (a later run resumes the partial file); also
        done when the store is collected, or at exit."""
        if self.lock_path is not None:
            _let_go(_key(self.lock_path), self._token)

    # --- one run per out ---------------------------------------------------------------------

    def _hold(self) -> None:
        assert self.lock_path is not None
        key = _key(self.lock_path)
        here = threading.get_ident()
        with _HOLDS_GUARD:
            hold = _HOLDS.get(key)
            if hold is not None and hold.pid == os.getpid():
                if hold.thread != here:
                    raise self._busy()
                # An earlier run of this thread that never finished (interrupted, its store
                # still referenced by a traceback): nothing of it runs any more.
                hold.owner = self._token
                weakref.finalize(self, _let_go, key, self._token)
                return
            lock = FileLock(self.lock_path, thread_local=False)
            try:
                self.lock_path.parent.mkdir(parents=True, exist_ok=True)
                lock.acquire(blocking=False)
            except Timeout:
                raise self._busy() from None
            except OSError as exc:
                raise GradleakError(f"cannot write {self.lock_path}: {_reason(exc)}") from None
            _HOLDS[key] = _Hold(lock, os.getpid(), here, self._token)
        weakref.finalize(self, _let_go, key, self._token)

    def _refuse_if_busy(self) -> None:
        """Fail before the model loads when another run holds ``out`` (a look that takes
        nothing, and makes no lock file)."""
        assert self.lock_path is not None
        with _HOLDS_GUARD:
            hold = _HOLDS.get(_key(self.lock_path))
        if hold is not None and hold.pid == os.getpid():
            if hold.thread != threading.get_ident():
                raise self._busy()
            return
        if not self.lock_path.exists():
            return
        probe = FileLock(self.lock_path, thread_local=False)
        try:
            probe.acquire(blocking=False)
        except Timeout:
            raise self._busy() from None
        except OSError:  # cannot tell (a read-only folder): start() will
            return
        probe.release()

    def _busy(self) -> GradleakError:
        return GradleakError(
            f"another run is writing {self.out} (it holds {self.lock_path}): wait for it to "
            "end, or choose another --out"
        )


@dataclass
class _Hold:
    """This process's lock on one ``out``: the thread whose run took it, and the store that
    holds it now (a later run of the same thread takes it over)."""

    lock: FileLock
    pid: int
    thread: int
    owner: object


_HOLDS: dict[str, _Hold] = {}
# Reentrant: a collected store's finalizer (``_let_go``) runs wherever garbage collection does,
# also in a thread that holds the guard (FileLock's constructor in ``_hold`` allocates).
_HOLDS_GUARD = threading.RLock()


def _key(lock_path: Path) -> str:
    return os.path.abspath(lock_path)


def _let_go(key: str, token: object) -> None:
    """Release the lock of ``key`` if the store of ``token`` holds it, and remove its file
    (removed while still held, so a run waiting on the old file retries on the path)."""
    with _HOLDS_GUARD:
        hold = _HOLDS.get(key)
        if hold is None or hold.owner is not token or hold.pid != os.getpid():
            return
        del _HOLDS[key]
    with contextlib.suppress(OSError):
        os.unlink(key)
    with contextlib.suppress(OSError):
        hold.lock.release()


def _header(line: bytes) -> dict[str, Any] | None:
    """The partial file's first line, or None where it is torn or not a header."""
    try:
        header = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        return None
    return header if isinstance(header, dict) else None


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _stored_identity(stored: Any) -> Any:
    """A stored header's config as today's identity: an option added since it was written
    takes its default, so an upgrade alone does not orphan an interrupted run."""
    try:
        return RunConfig.identity_of(stored)
    except (ValueError, TypeError, GradleakError):  # no config today reads: it cannot match
        return stored
