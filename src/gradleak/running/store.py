"""Results on disk: finished inputs are appended as they complete, so nothing done is lost.

``OUT.json`` is written when a run completes; while it runs, each finished input is one line of
``OUT.json.partial.jsonl`` (the first line holds the config). Running the same config with the
same ``--out`` again resumes after the last finished input.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from gradleak.config import RunConfig
from gradleak.errors import GradleakError


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

    def load_finished(self) -> dict[int, dict[str, Any]]:
        """Samples finished by an earlier, interrupted run of the same config."""
        if self.partial is None or not self.partial.exists():
            return {}
        lines = self.partial.read_text(encoding="utf-8").splitlines()
        if not lines:
            return {}
        header = json.loads(lines[0])
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
            except json.JSONDecodeError:  # a line cut off by the interruption
                continue
            finished[sample["index"]] = sample
        return finished

    def start(self) -> None:
        if self.partial is None:
            return
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        if not self.partial.exists() or not self.partial.read_text(encoding="utf-8").strip():
            header = {"config": self.identity, "device": self.device}
            self.partial.write_text(json.dumps(header) + "\n", "utf-8")

    def append(self, sample: dict[str, Any]) -> None:
        if self.partial is None:
            return
        with self.partial.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(sample) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def finish(self, record: dict[str, Any]) -> None:
        if self.out is None:
            return
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.out)
        if self.partial is not None and self.partial.exists():
            self.partial.unlink()


def _stored_identity(stored: Any) -> Any:
    """A stored header's config as today's identity: an option added since it was written
    takes its default, so an upgrade alone does not orphan an interrupted run."""
    try:
        return RunConfig.identity_of(stored)
    except (ValueError, TypeError, GradleakError):  # no config today reads: it cannot match
        return stored
