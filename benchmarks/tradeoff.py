"""The privacy-utility trade-off of a defense suite: one table row per defense setting with its
utility, epsilon and each attack's leakage, and a plot of each attack's leakage (strict ROUGE-2
and exact matches) against the fine-tuned model's dev metric, against DP-SGD's epsilon, or
against the number of securely aggregated clients.

Reads ``<suite>.json`` (the attack cells) and ``<suite>_utility.json`` where it exists; writes
``<suite>_tradeoff.md`` and ``<suite>.png`` next to them. A cell named ``ATTACK-DATASET-LABEL``
is the attack under the defense setting ``LABEL``, which is also its utility row's ``defense``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

MARKERS = ("o", "s", "^", "D", "v", "P")  # tell apart attacks whose points coincide
LEAKAGE = (("R-2 strict", "strict ROUGE-2"), ("exact %", "exact inputs (%)"))


def tradeoff_plot(out_dir: Path, suite: str) -> Path | None:
    """Draw the suite's privacy-utility figure; None when it has no finished rows."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    cells = _rows(out_dir / f"{suite}.json")
    if not cells:
        return None
    utility = {row["defense"]: row for row in _rows(out_dir / f"{suite}_utility.json")}
    axes_x = _x_axes(cells, utility)
    if not axes_x:
        return None
    figure, grid = plt.subplots(
        len(axes_x), len(LEAKAGE), figsize=(5.5 * len(LEAKAGE), 4 * len(axes_x)), squeeze=False
    )
    by_attack: dict[str, list[dict[str, Any]]] = {}
    for row in cells:
        by_attack.setdefault(_attack(row["cell"]), []).append(row)
    for (x_label, x_of, log), panels in zip(axes_x, grid, strict=True):
        for (column, y_label), ax in zip(LEAKAGE, panels, strict=True):
            for (attack, rows), marker in zip(by_attack.items(), MARKERS * 4, strict=False):
                points = sorted(
                    (x_of(row), row[column], _label(row["cell"]))
                    for row in rows
                    if x_of(row) is not None
                )
                if not points:
                    continue
                xs, ys, labels = zip(*points, strict=True)
                ax.plot(xs, ys, marker=marker, markersize=7, alpha=0.8, label=attack)
                refused = [(x_of(r), r[column]) for r in rows if _refused(r)]
                refused = [(x, y) for x, y in refused if x is not None]
                if refused:  # every input refused: the attack does not apply here
                    ax.scatter(*zip(*refused, strict=True), marker="x", s=70, color="black",
                               zorder=3)  # fmt: skip
                for x, y, label in points:
                    ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")  # fmt: skip
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
            ax.set_ylim(-3, 103)
            if log:
                ax.set_xscale("log")
            ax.grid(alpha=0.3)
    grid[0][0].legend(fontsize=8)
    figure.suptitle(f"{suite}: leakage against what the defense costs (x: attack refused)")
    figure.tight_layout()
    path = out_dir / f"{suite}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def tradeoff_table(out_dir: Path, suite: str) -> Path | None:
    """Write ``<suite>_tradeoff.md``: per defense setting, the utility (dev metrics after
    fine-tuning), epsilon where DP-SGD gives one, and each attack's strict ROUGE-1 / ROUGE-2 /
    exact %; "refused" where the attack refused every input. None without rows."""
    cells = _rows(out_dir / f"{suite}.json")
    if not cells:
        return None
    utility = {row["defense"]: row for row in _rows(out_dir / f"{suite}_utility.json")}
    leakage = {(_attack(r["cell"]), _label(r["cell"])): r for r in cells}
    labels = list(dict.fromkeys([*utility, *(label for _, label in leakage)]))
    attacks = list(dict.fromkeys(attack for attack, _ in leakage))
    most = max(r["inputs"] for r in cells)  # a cell with fewer is still part-way
    metrics = [m for m in ("accuracy", "f1", "mcc", "perplexity")
               if any(m in row for row in utility.values())]  # fmt: skip
    epsilons = {_label(r["cell"]): r["epsilon"] for r in cells if "epsilon" in r}
    header = ["defense", *metrics, *(["epsilon"] if epsilons else []), *attacks]
    lines = [f"# {suite}: leakage and utility", "",
             "Utility: dev metrics (%) after fine-tuning under the defense. Leakage: strict "
             "ROUGE-1 / ROUGE-2 / exact inputs (%) per attack.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]  # fmt: skip
    for label in labels:
        row = [label, *(_number(utility.get(label, {}).get(m)) for m in metrics)]
        if epsilons:
            row.append(_number(epsilons.get(label)))
        row += [_leakage(leakage.get((attack, label)), most) for attack in attacks]
        lines.append("| " + " | ".join(row) + " |")
    path = out_dir / f"{suite}_tradeoff.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _leakage(row: dict[str, Any] | None, most: int) -> str:
    """A cell's strict R-1 / R-2 / exact %, with its number of inputs when it has fewer than
    the suite's fullest cell (a part-way cell)."""
    if row is None:
        return "–"
    if _refused(row):
        return "refused"
    text = f"{row['R-1 strict']:.1f} / {row['R-2 strict']:.1f} / {row['exact %']:.0f}"
    return text + (f" (n={row['inputs']})" if row["inputs"] < most else "")


def _number(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _x_axes(cells: list[dict[str, Any]], utility: dict[str, dict[str, Any]]) -> list[tuple]:
    """(axis title, row -> x or None, log scale) for every axis the suite's data allows."""
    axes = []
    if utility:
        metric = "mcc" if "mcc" in next(iter(utility.values())) else "perplexity"
        title = "dev MCC (%) after fine-tuning" if metric == "mcc" else "dev perplexity"
        axes.append((title, lambda row: utility.get(_label(row["cell"]), {}).get(metric), False))
    epsilons = {_label(r["cell"]): r["epsilon"] for r in cells if r.get("epsilon") is not None}
    if epsilons:
        axes.append(("epsilon (per client round)", lambda row: epsilons.get(_label(row["cell"])),
                     True))  # fmt: skip
    if all(re.fullmatch(r"K\d+", _label(r["cell"])) for r in cells):
        axes.append(("clients summed (K)", lambda row: int(_label(row["cell"])[1:]), True))
    return axes


def _refused(row: dict[str, Any]) -> bool:
    return row["inputs"] > 0 and row["failed"] == row["inputs"]


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    return [r for r in rows if not any(isinstance(v, float) and math.isnan(v) for v in r.values())]


def _label(cell: str) -> str:
    """The defense setting of ``ATTACK-DATASET-LABEL``."""
    return cell.rsplit("-", 1)[1]


def _attack(cell: str) -> str:
    """The attack (and its variant) of ``ATTACK-DATASET-LABEL``."""
    return cell.rsplit("-", 2)[0]
