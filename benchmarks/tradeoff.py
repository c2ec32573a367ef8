"""The privacy-utility trade-off of a defense table (benchmarks/experiments/defense_*.yaml, run
by ``gradleak run``): what each defense setting costs the model, beside what each attack
still recovers under it.

``python benchmarks/tradeoff.py RESULTS [--data-dir DIR] [--out DIR]``, RESULTS the
experiment's results folder (``gradleak run``'s ``--out``, default ``runs/NAME``):

1. fine-tunes MiniLM under each defense setting of the experiment's cells, and without one
   (``gradleak utility``'s federated fine-tuning, the settings below), keeping each record in
   the results folder's database, so a finished one is read back instead of run again and
   another experiment's same fine-tuning beside it is copied (``--report``: run none);
2. writes ``NAME_utility.json`` and ``.md`` (dev metrics before and after, with the machine,
   the versions and the wall time), ``NAME_tradeoff.md`` (per defense setting: the utility,
   epsilon where DP-SGD gives one, each attack's strict ROUGE-1 / ROUGE-2 / exact %) and
   ``NAME.png`` (each attack's leakage against the fine-tuned model's dev metric, against
   DP-SGD's epsilon, or against the number of securely aggregated clients) in ``--out``.

A cell named ``ATTACK-DATASET-LABEL`` (the experiment files' ``cell_name``) is the attack under
the defense setting ``LABEL``, which is also its utility row's ``defense``. Secure aggregation
has no utility row: the server applies the same mean of the same updates.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from report import write_results

from gradleak.config.options import options_of, utility_from_options
from gradleak.experiments.database import ExperimentDatabase
from gradleak.experiments.kept import other_databases
from gradleak.experiments.utility import stored_or_measured, utility_identity, utility_key
from gradleak.reports import CellReport, read_report_data

MARKERS = ("o", "s", "^", "D", "v", "P")  # tell apart attacks whose points coincide
LEAKAGE = (("R-2 strict", "strict ROUGE-2"), ("exact %", "exact inputs (%)"))

# The fine-tuning that measures each defense's utility: FedSGD as the attacked clients run it,
# in eval mode, 60 rounds of 4 clients with 8 examples each, the server stepping Adam (FedAdam,
# lr 1e-4) with the mean gradient. Plain SGD steps at lr 0.02 and 0.05 left MiniLM at chance on
# SST-2 in 60 rounds; FedAdam reached 82% (MCC 63-65). On SST-2 whatever the attacked dataset:
# within this budget MiniLM stays at CoLA's majority class (MCC 0) even undefended, so CoLA
# would show no cost at all; SST-2 moves (MCC 63 undefended).
UTILITY_FINE_TUNING = {"model": "minilm", "dataset": "sst2", "mode": "eval",
                       "server_optimizer": "adam", "server_lr": 1e-4, "rounds": 60, "clients": 4,
                       "samples": 8, "eval_every": 20, "eval_examples": 256}  # fmt: skip
# Sign compression fine-tunes with its per-tensor mean-magnitude scale (signSGD at the
# gradient's step size; a bare sign step of lr per coordinate would wreck the model at any lr
# tuned for gradients); the attacked update carries no scale, which the sign-aware loss would
# ignore anyway.
FINE_TUNED_AS = {"sign": "sign:scale=mean"}
NO_UTILITY = "secagg"  # secure aggregation: the fine-tuning is the undefended one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the defense experiment's results folder")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--data-dir", default=os.environ.get("GRADLEAK_DATA_DIR"))
    parser.add_argument("--device", default="cpu", help="where the fine-tunings compute")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument(
        "--report", action="store_true", help="run nothing: the tables from stored results"
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    cells = read_report_data(args.results).cells
    name = _experiment_name(args.results)
    paths = list(
        run_utility(args.results, name, cells, args.out, args.data_dir, args.device, args.report)
    )
    paths += [tradeoff_table(args.out, name, cells), tradeoff_plot(args.out, name, cells)]
    for path in paths:
        if path is not None:
            print(f"wrote {path}")


def _experiment_name(results: Path) -> str:
    with ExperimentDatabase(results, create=False) as database:
        return database.meta("name") or results.name


# --- utility -----------------------------------------------------------------------------


def utility_cells(cells: list[CellReport], data_dir: str | None) -> list[tuple[str, dict]]:
    """(label, ``gradleak utility`` options) for no defense and each defense setting of the
    cells (by the label their names end with); none where every setting is secure
    aggregation or none."""
    settings: dict[str, str] = {}
    for cell in cells:
        spec = str(options_of(cell.config)["defense"])
        if NO_UTILITY not in spec and spec != "none":
            settings.setdefault(_label(cell.name), FINE_TUNED_AS.get(spec, spec))
    if not settings:
        return []
    every = {"none": "none", **settings}
    return [(label, {**UTILITY_FINE_TUNING, "data_dir": data_dir, "defense": spec})
            for label, spec in every.items()]  # fmt: skip


def run_utility(
    results: Path,
    name: str,
    cells: list[CellReport],
    out: Path,
    data_dir: str | None,
    device: str = "cpu",
    report: bool = False,
) -> tuple[Path, Path] | tuple[()]:
    """Fine-tune (or, with ``report``, only read back) each utility cell into the results
    folder's database; write ``NAME_utility.json`` and ``.md``: dev metrics before and after
    fine-tuning. Nothing where the experiment has no utility cells."""
    wanted = utility_cells(cells, data_dir)
    if not wanted:
        return ()
    started = time.perf_counter()
    rows = []
    with ExperimentDatabase(results) as database:
        for label, options in wanted:
            config, settings = utility_from_options(options)
            key = utility_key(config, settings)
            record = database.utility(key) or _beside(database, key)
            if record is not None:
                database.store_utility(key, utility_identity(config, settings), record)
            elif not report:
                begun = time.perf_counter()
                record = stored_or_measured(database, config, settings, device)
                final = record["metrics"][-1]
                print(f"utility {label}: {final} ({time.perf_counter() - begun:.0f} s)")
            if record is not None:
                rows.append(utility_row(label, options["defense"], record))
    _, settings = utility_from_options(wanted[0][1])
    notes = (
        f"{len(rows)} of {len(wanted)} utility cells finished. Fine-tuning: {settings.rounds} "
        f"rounds of {settings.clients} clients with {settings.samples} examples each; dev: "
        f"{settings.eval_examples} examples of the {settings.eval_split} split."
    )
    return write_results(out, f"{name}_utility", rows, started, notes=notes)


def _beside(database: ExperimentDatabase, key: str) -> dict[str, Any] | None:
    """The same fine-tuning in another experiment's results folder beside this one."""
    for other in other_databases(database.folder.parent, database.folder.resolve()):
        if (record := other.utility(key)) is not None:
            return record
    return None


def utility_row(label: str, defense: str, record: dict[str, Any]) -> dict[str, Any]:
    """A utility cell's line: dev metrics of the untrained and the fine-tuned model."""
    before, after = record["metrics"][0], record["metrics"][-1]
    row: dict[str, Any] = {"defense": label, "spec": defense}
    for metric, value in after.items():
        row[metric] = value
        row[f"{metric} before"] = before[metric]
    row["s"] = record["seconds"]
    return row


# --- the trade-off -----------------------------------------------------------------------


def leakage_rows(cells: list[CellReport]) -> list[dict[str, Any]]:
    """Each cell with finished inputs: its strict scores over them, failures and epsilon."""
    rows = []
    for cell in cells:
        if cell.done == 0:
            continue
        strict = cell.metrics.strict
        row = {
            "cell": cell.name,
            "inputs": cell.done,
            "R-1 strict": strict.rouge1 if strict else 0.0,
            "R-2 strict": strict.rouge2 if strict else 0.0,
            "exact %": strict.exact_match if strict else 0.0,
            "failed": cell.failed,
        }
        privacy = next((p for s in cell.samples if (p := (s.get("info") or {}).get("privacy"))),
                       None)  # fmt: skip
        if privacy:
            row["epsilon"] = privacy.get("epsilon")
        if not any(isinstance(v, float) and math.isnan(v) for v in row.values()):
            rows.append(row)
    return rows


def tradeoff_table(out_dir: Path, name: str, cells: list[CellReport]) -> Path | None:
    """Write ``NAME_tradeoff.md``: per defense setting, the utility (dev metrics after
    fine-tuning), epsilon where DP-SGD gives one, and each attack's strict ROUGE-1 / ROUGE-2 /
    exact %; "refused" where the attack refused every input. None without rows."""
    rows = leakage_rows(cells)
    if not rows:
        return None
    utility = _utility_rows(out_dir / f"{name}_utility.json")
    leakage = {(_attack(r["cell"]), _label(r["cell"])): r for r in rows}
    labels = list(dict.fromkeys([*utility, *(label for _, label in leakage)]))
    attacks = list(dict.fromkeys(attack for attack, _ in leakage))
    most = max(r["inputs"] for r in rows)  # a cell with fewer is still part-way
    metrics = [m for m in ("accuracy", "f1", "mcc", "perplexity")
               if any(m in row for row in utility.values())]  # fmt: skip
    epsilons = {_label(r["cell"]): r["epsilon"] for r in rows if "epsilon" in r}
    header = ["defense", *metrics, *(["epsilon"] if epsilons else []), *attacks]
    lines = [f"# {name}: leakage and utility", "",
             "Utility: dev metrics (%) after fine-tuning under the defense. Leakage: strict "
             "ROUGE-1 / ROUGE-2 / exact inputs (%) per attack.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]  # fmt: skip
    for label in labels:
        row = [label, *(_number(utility.get(label, {}).get(m)) for m in metrics)]
        if epsilons:
            row.append(_number(epsilons.get(label)))
        row += [_leakage(leakage.get((attack, label)), most) for attack in attacks]
        lines.append("| " + " | ".join(row) + " |")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}_tradeoff.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tradeoff_plot(out_dir: Path, name: str, cells: list[CellReport]) -> Path | None:
    """Draw the privacy-utility figure ``NAME.png``; None when it has no finished rows."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rows = leakage_rows(cells)
    if not rows:
        return None
    utility = _utility_rows(out_dir / f"{name}_utility.json")
    axes_x = _x_axes(rows, utility)
    if not axes_x:
        return None
    figure, grid = plt.subplots(
        len(axes_x), len(LEAKAGE), figsize=(5.5 * len(LEAKAGE), 4 * len(axes_x)), squeeze=False
    )
    by_attack: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_attack.setdefault(_attack(row["cell"]), []).append(row)
    for (x_label, x_of, log), panels in zip(axes_x, grid, strict=True):
        for (column, y_label), ax in zip(LEAKAGE, panels, strict=True):
            for (attack, attack_rows), marker in zip(by_attack.items(), MARKERS * 4,
                                                     strict=False):  # fmt: skip
                points = sorted(
                    (x_of(row), row[column], _label(row["cell"]))
                    for row in attack_rows
                    if x_of(row) is not None
                )
                if not points:
                    continue
                xs, ys, labels = zip(*points, strict=True)
                ax.plot(xs, ys, marker=marker, markersize=7, alpha=0.8, label=attack)
                refused = [(x_of(r), r[column]) for r in attack_rows if _refused(r)]
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
    figure.suptitle(f"{name}: leakage against what the defense costs (x: attack refused)")
    figure.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _leakage(row: dict[str, Any] | None, most: int) -> str:
    """A cell's strict R-1 / R-2 / exact %, with its number of inputs when it has fewer than
    the table's fullest cell (a part-way cell)."""
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


def _x_axes(rows: list[dict[str, Any]], utility: dict[str, dict[str, Any]]) -> list[tuple]:
    """(axis title, row -> x or None, log scale) for every axis the table's data allows."""
    axes = []
    if utility:
        metric = "mcc" if "mcc" in next(iter(utility.values())) else "perplexity"
        title = "dev MCC (%) after fine-tuning" if metric == "mcc" else "dev perplexity"
        axes.append((title, lambda row: utility.get(_label(row["cell"]), {}).get(metric), False))
    epsilons = {_label(r["cell"]): r["epsilon"] for r in rows if r.get("epsilon") is not None}
    if epsilons:
        axes.append(("epsilon (per client round)", lambda row: epsilons.get(_label(row["cell"])),
                     True))  # fmt: skip
    if all(re.fullmatch(r"K\d+", _label(r["cell"])) for r in rows):
        axes.append(("clients summed (K)", lambda row: int(_label(row["cell"])[1:]), True))
    return axes


def _refused(row: dict[str, Any]) -> bool:
    return row["inputs"] > 0 and row["failed"] == row["inputs"]


def _utility_rows(path: Path) -> dict[str, dict[str, Any]]:
    """The utility table's rows by defense label ({} before any fine-tuning)."""
    if not path.exists():
        return {}
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    return {row["defense"]: row for row in rows}


def _label(cell: str) -> str:
    """The defense setting of ``ATTACK-DATASET-LABEL``."""
    return cell.rsplit("-", 1)[1]


def _attack(cell: str) -> str:
    """The attack (and its variant) of ``ATTACK-DATASET-LABEL``."""
    return cell.rsplit("-", 2)[0]


if __name__ == "__main__":
    main()
