"""``gradleak flower SETUP.yaml``: a simulated Flower federation with a leakage audit, one
line of utility and leakage per round."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gradleak.cli.console import console, fail, shown
from gradleak.errors import GradleakError


def flower(
    setup: Annotated[Path, typer.Argument(help="the federation's setup file (YAML)")],
    out: Annotated[
        Path | None, typer.Option(help="results folder (federation.sqlite); default: none kept")
    ] = None,
    data_dir: Annotated[
        str | None, typer.Option(help="data folder, if the setup names none (else env)")
    ] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="run the clients on the Ray cluster at HOST:PORT")
    ] = None,
) -> None:
    """Simulate a Flower federation (the setup's model, data, clients, rounds, LoRA, DP) and
    audit its updates with gradleak's attacks: per round, the global model's dev metrics and
    what each attack recovered (exact %, ROUGE-2, canaries)."""
    try:
        from gradleak.integrations.flower import load_setup

        loaded = load_setup(setup)  # a bad setup file answers before Flower and torch load
        from gradleak.integrations.flower import run_federation

        if data_dir is not None and loaded.data.data_dir is None:
            data = loaded.data.model_copy(update={"data_dir": data_dir})
            loaded = loaded.model_copy(update={"data": data})
        console.print(
            shown(
                f"Flower federation: {loaded.partition.clients} clients, {loaded.rounds} "
                f"rounds, {loaded.protocol.algorithm}, {loaded.model} on "
                f"{loaded.data.dataset}; audit: "
                f"{', '.join(a.name for a in loaded.audit.attacks) or 'none'}"
            ),
            highlight=False,
        )
        result = run_federation(loaded, out, on_round=_print_round, ray_address=ray_address)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    if result.privacy:
        from gradleak.cli.utility import print_privacy

        for measured in result.privacy:
            print_privacy(measured)
    console.print(shown(f"done in {result.seconds:.1f} s" + (f"; results in {out}" if out else "")))


def _print_round(result: Any) -> None:
    utility = ", ".join(f"{k} {v:.1f}" for k, v in result.utility.items()) or "not measured"
    table = Table(
        title=shown(
            f"round {result.round}: {utility} ({result.seconds:.1f} s, of which audit "
            f"{result.audit_seconds:.1f} s)"
        ),
        title_justify="left",
    )
    columns = ("attack", "updates", "exact %", "ROUGE-1", "ROUGE-2", "canaries", "secrets", "s")
    for column in columns:
        table.add_column(column, justify="left" if column == "attack" else "right")
    for attack, line in result.leakage.items():
        canaries = line.get("canaries")
        table.add_row(
            shown(attack),
            f"{line['updates']}" + (f" ({line['refused']} refused)" if line["refused"] else ""),
            _number(line.get("exact_%")),
            _number(line.get("rouge1")),
            _number(line.get("rouge2")),
            f"{canaries['exact']}/{canaries['of']}" if canaries else "-",
            f"{len(canaries['secrets'])}/{canaries['secrets_total']}" if canaries else "-",
            f"{line['seconds']:.1f}",
        )
    console.print(table)
    for scoring, measured in result.privacy.items():
        if measured is None:
            continue
        console.print(
            f"  measured epsilon ({scoring}; {measured.canaries} this round, "
            f"{measured.inserted} inserted): >= {measured.gdp_epsilon:.2f} (Gaussian DP), >= "
            f"{measured.epsilon:.2f} ((epsilon, delta) at {measured.delta:g}), at most "
            f"{measured.ceiling:.2f} shown by as many, AUROC {measured.auroc:.3f}",
            highlight=False,
        )
    refusals = {(e.attack, e.refusal) for e in result.entries if e.refusal}
    for attack, reason in sorted(refusals):
        console.print(f"  [dim]{shown(attack)} refused: {shown(reason)}[/]", highlight=False)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
