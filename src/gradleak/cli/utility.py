"""``gradleak utility``: what a scenario's protocol and defenses cost the model."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.table import Table

from gradleak.cli.console import console, fail, shown
from gradleak.cli.parameters import utility_command_parameters
from gradleak.config.options import utility_from_options
from gradleak.errors import GradleakError
from gradleak.runtime.files import write_atomic
from gradleak.runtime.progress import progress_bar
from gradleak.scenario.checks import check_scenario

if TYPE_CHECKING:
    from gradleak.evaluation.canary_audit import EmpiricalPrivacy


def utility(**options: Any) -> None:
    """What the scenario's protocol and defenses cost the model: federated fine-tuning with
    the same clients, then dev-split accuracy, F1 and MCC (classification) or perplexity."""
    threads, out = options.pop("threads"), options.pop("out")
    device = options.pop("device") or "cpu"
    try:
        config, settings = utility_from_options(options)
        check_scenario(config)  # bad input answers before torch loads
        from gradleak.evaluation.utility import measure_utility, utility_record
        from gradleak.runtime.state import kept_global_state

        with (
            kept_global_state(threads),
            progress_bar("fine-tuning rounds", settings.rounds) as advance,
        ):
            result = measure_utility(config, settings, advance, device)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    table = Table(
        title=shown(f"utility of {config.scenario.model} on {config.scenario.data.dataset}")
    )
    table.add_column("round", justify="right")
    for name in result.metrics[0]:
        table.add_column(shown(name), justify="right")
    for r, values in zip(result.rounds, result.metrics, strict=True):
        table.add_row(str(r), *(f"{v:.1f}" for v in values.values()))
    console.print(table)
    for privacy in (result.privacy, result.records):
        if privacy:
            print_privacy(privacy)
    console.print(f"time: {result.seconds:.1f} s")
    if out:
        text = json.dumps(utility_record(config, settings, result), indent=2) + "\n"
        try:
            write_atomic(out, text)
        except GradleakError as exc:
            raise fail(str(exc)) from None
        console.print(f"record written to {shown(out)}")


def print_privacy(privacy: EmpiricalPrivacy) -> None:
    """The canaries' measured epsilon, per round and over the run, beside the most as many
    canaries could show (and, for canary records, the accountant's epsilon)."""
    overall = privacy.overall
    what = "canary clients" if privacy.kind == "clients" else "canary records"
    if privacy.kind == "records" and privacy.scoring != "gradient":
        what += f" scored by {privacy.scoring}"
    table = Table(
        title=f"measured epsilon: {privacy.canaries} {what}, lower bounds at "
        f"{overall.confidence:.0%} confidence, delta {overall.delta:g}"
    )
    for name in ("round", "canaries", "inserted", "GDP eps", "(eps, delta)", "at most", "AUROC"):
        table.add_column(name, justify="right")
    rows = [(str(r + 1), summary) for r, summary in enumerate(privacy.rounds)]
    for label, summary in [*rows, ("all", overall)]:
        if summary is None:
            table.add_row(label, *["-"] * 6)
            continue
        table.add_row(
            label,
            str(summary.canaries),
            str(summary.inserted),
            f"{summary.gdp_epsilon:.2f}",
            f"{summary.epsilon:.2f}",
            f"{summary.ceiling:.2f}",
            f"{summary.auroc:.3f}",
        )
    console.print(table)
    if privacy.kind == "records":
        promised = "none" if privacy.accountant is None else f"{privacy.accountant:.2f}"
        console.print(f"the accountant's epsilon of one client's round (DP-SGD): {promised}")
    if overall.gdp_epsilon >= 0.99 * overall.ceiling:
        console.print(
            "the bound is the most these canaries can show: more canaries would show more"
        )


utility_command_parameters(utility)
