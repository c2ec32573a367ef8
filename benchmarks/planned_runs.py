"""Planned runs against the one-by-one runs every command made before plans: the README's plain
commands (``gradleak attack --attack lamp-cos --mode eval --n-inputs 8``, the same with
``--attack tag``) on CoLA's first inputs, each once with its plan and once with
``--workers 1 --stack 1`` (one process, the process's torch threads, one input a pass), in one
process, one after the other; wall seconds per input and the paper-compatible and strict
scores of both."""

from __future__ import annotations

import time
from pathlib import Path

from report import cola_or_skip, write_results

import gradleak

ATTACKS = ("lamp-cos", "tag")
ONE_BY_ONE = {"workers": 1, "stack": 1}


def planned_runs(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """``batches`` inputs of each attack, planned then one by one (the plain command's
    defaults otherwise: MiniLM, B=1, eval mode, each attack's own steps)."""
    started = time.perf_counter()
    if cola_or_skip("planned_runs", data_dir) is None:
        return
    rows = []
    for attack in ATTACKS:
        options = {"attack": attack, "mode": "eval", "n_inputs": batches, "dataset": "cola",
                   "data_dir": data_dir, "progress": False}  # fmt: skip
        for arm, plan in (("planned", {}), ("one by one", ONE_BY_ONE)):
            begun = time.perf_counter()
            record = gradleak.attack(**options, **plan)
            wall = time.perf_counter() - begun
            strict, paper = record.metrics.strict, record.metrics.paper
            rows.append({
                "attack": attack,
                "run": arm,
                "plan": record.plan.text.removeprefix("plan: ") if record.plan else "",
                "inputs": len(record.samples),
                "wall s / input": wall / len(record.samples),
                "paper R-1": paper.rouge1,
                "paper R-2": paper.rouge2,
                "strict R-1": strict.rouge1,
                "strict R-2": strict.rouge2,
            })  # fmt: skip
            print(rows[-1], flush=True)
    notes = (
        "Each attack's plain command on CoLA's first inputs in LAMP's order: planned (the "
        "default now), then with --workers 1 --stack 1 (the default before plans), in one "
        "process one after the other."
    )
    for path in write_results(out_dir, "planned_runs", rows, started, notes=notes):
        print(f"wrote {path}")


SUITES = {"planned_runs": planned_runs}
