"""Writing benchmark results: machine-readable JSON plus a markdown table, with the machine,
the library versions and the wall time recorded next to the numbers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gradleak.data import Example, load_examples
from gradleak.errors import GradleakError
from gradleak.runtime.environment import machine, versions


def write_results(
    out_dir: Path, name: str, rows: list[dict[str, Any]], started: float, notes: str = ""
) -> tuple[Path, Path]:
    """Write ``name.json`` and ``name.md`` under ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wall_s = time.perf_counter() - started
    payload = {
        "benchmark": name,
        "rows": rows,
        "machine": machine(),
        "versions": versions(),
        "wall_s": wall_s,
        "notes": notes,
    }
    json_path = out_dir / f"{name}.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    md_path = out_dir / f"{name}.md"
    md_path.write_text(markdown(payload), encoding="utf-8")
    return json_path, md_path


def markdown(payload: dict[str, Any]) -> str:
    rows = payload["rows"]
    columns = list(rows[0]) if rows else []
    lines = [f"# {payload['benchmark']}", ""]
    if payload["notes"]:
        lines += [payload["notes"], ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[c]) for c in columns) + " |")
    m, v = payload["machine"], payload["versions"]
    lines += [
        "",
        f"Machine: {m['platform']}, {m['cpu_count']} CPUs, torch threads {m['torch_threads']}"
        + "".join(f", {gpu}" for gpu in m.get("cuda_devices", []))
        + ".",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        f"Wall time: {payload['wall_s']:.1f} s.",
        "",
    ]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def cola_or_skip(suite: str, data_dir: str | None) -> list[Example] | None:
    """CoLA's training examples, or None after saying why the suite is skipped."""
    return examples_or_skip(suite, "cola", data_dir)


def examples_or_skip(suite: str, dataset: str, data_dir: str | None) -> list[Example] | None:
    """A dataset's default split, or None after saying why the suite is skipped."""
    try:
        return load_examples(dataset, data_dir, None, None)
    except GradleakError as exc:
        print(f"{suite}: skipped, it needs the {dataset} data: {exc}")
        return None
