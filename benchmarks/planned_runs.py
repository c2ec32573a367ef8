"""Planned runs against the one-by-one runs every command made before plans: the README's plain
commands (``gradleak attack --attack lamp-cos --mode eval --n-inputs 8``, the same with
``--attack tag``) on CoLA's first inputs, each once with its plan and once one by one, in one
process, one after the other; wall seconds per input and the paper-compatible and strict
scores of both.

"One by one" is this code with ``--workers 1 --stack 1`` (one process, the process's torch
threads, one input a pass), or, given ``--before REV``, the plain command of the git revision
REV itself (its ``src`` exported to a temporary folder, run in a subprocess on this
environment's packages): the release the plans are measured against, with whatever else has
become faster since. With ``--before`` a single-input LAMP_cos run of both is timed too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

from report import cola_or_skip, write_results

import gradleak

ATTACKS = ("lamp-cos", "tag")
ONE_BY_ONE = {"workers": 1, "stack": 1}
REPOSITORY = Path(__file__).resolve().parent.parent


def planned_runs(
    out_dir: Path, batches: int, data_dir: str | None, before: str | None = None
) -> None:
    """``batches`` inputs of each attack, one by one then planned (the plain command's
    defaults otherwise: MiniLM, B=1, eval mode, each attack's own steps)."""
    started = time.perf_counter()
    if cola_or_skip("planned_runs", data_dir) is None:
        return
    runs = [(attack, batches) for attack in ATTACKS]
    if before is not None:
        runs.append(("lamp-cos", 1))
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        release = export_source(before, Path(scratch)) if before else None
        for attack, inputs in runs:
            options = {"attack": attack, "mode": "eval", "n_inputs": inputs, "dataset": "cola",
                       "data_dir": data_dir}  # fmt: skip
            if release is None:
                arm, (wall, record) = "one by one", timed_in_process(options | ONE_BY_ONE)
            else:
                arm, (wall, record) = f"release {before}", timed_release(options, release)
            rows.append(row(attack, arm, wall, record))
            print(rows[-1], flush=True)
            rows.append(row(attack, "planned", *timed_in_process(options)))
            print(rows[-1], flush=True)
    baseline = f"git revision {before}'s plain command" if before else "--workers 1 --stack 1"
    notes = (
        "Each attack's plain command on CoLA's first inputs in LAMP's order: one by one "
        f"({baseline}), then planned (the default now), in one process one after the other."
    )
    for path in write_results(out_dir, "planned_runs", rows, started, notes=notes):
        print(f"wrote {path}")


def timed_in_process(options: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Wall seconds and the record (as JSON) of one ``gradleak.attack`` call."""
    begun = time.perf_counter()
    record = gradleak.attack(**options, progress=False)
    wall = time.perf_counter() - begun
    payload = record.to_json()
    payload["plan_text"] = record.plan.text.removeprefix("plan: ") if record.plan else ""
    return wall, payload


def timed_release(options: dict[str, Any], source: Path) -> tuple[float, dict[str, Any]]:
    """Wall seconds and the JSON record of the release's own command line, run from its
    exported ``src`` (the subprocess's start, about a second, is inside the wall time)."""
    out = source / "record.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, "-c", "from gradleak.cli import app; app()", "attack",
               "--attack", options["attack"], "--mode", options["mode"],
               "--n-inputs", str(options["n_inputs"]), "--dataset", options["dataset"],
               "--data-dir", str(options["data_dir"]), "--out", str(out)]  # fmt: skip
    environment = os.environ | {"PYTHONPATH": str(source / "src")}
    begun = time.perf_counter()
    subprocess.run(command, cwd=source, env=environment, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - begun
    return wall, json.loads(out.read_text(encoding="utf-8"))


def export_source(revision: str, into: Path) -> Path:
    """The package source of ``revision`` of this repository, written under ``into``."""
    archive = subprocess.run(["git", "archive", "--format=tar", revision, "src"],
                             cwd=REPOSITORY, check=True, capture_output=True).stdout  # fmt: skip
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def row(attack: str, arm: str, wall: float, record: dict[str, Any]) -> dict[str, Any]:
    """One table row from a record's JSON."""
    inputs = len(record["samples"])
    strict, paper = record["metrics"]["strict"], record["metrics"]["paper"]
    return {
        "attack": attack,
        "run": arm,
        "plan": record.get("plan_text", ""),
        "inputs": inputs,
        "wall s / input": wall / inputs,
        "paper R-1": paper["rouge1"],
        "paper R-2": paper["rouge2"],
        "strict R-1": strict["rouge1"],
        "strict R-2": strict["rouge2"],
    }


SUITES = {"planned_runs": planned_runs}
