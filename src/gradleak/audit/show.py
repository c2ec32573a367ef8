"""An audit's result in words: the verdict first, then each attack, each change tried and
the facts behind them; in the terminal (rich) and as one offline HTML page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from gradleak.experiments.estimate import duration
from gradleak.runtime.files import write_atomic
from gradleak.runtime.terminal import shown

if TYPE_CHECKING:
    from gradleak.audit.result import AttackOutcome, AuditResult

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*$")


def parse_budget(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1.5h`` in seconds."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"'{text}' is not a duration: use for example 600, 90s, 10m or 1.5h")
    unit = {"h": 3600, "m": 60, "min": 60}.get(match.group(2) or "s", 1)
    return float(match.group(1)) * unit


def outcome_text(outcome: AttackOutcome) -> tuple[str, str, str, str]:
    """exact %, ROUGE-2, secrets recovered, and what happened, as table cells."""
    leak = outcome.leakage
    if leak is None:
        return "–", "–", "–", f"{outcome.status}: {outcome.why}"
    secrets = f"{len(leak.secrets)}/{leak.secrets_total}"
    if leak.secrets:
        shown = ", ".join(dict.fromkeys(leak.secrets))
        secrets += f" ({shown[:60]}{'…' if len(shown) > 60 else ''})"
    steps = f", {outcome.steps} steps" if outcome.steps else ""
    return f"{leak.exact:.0f}", f"{leak.rouge2:.1f}", secrets, f"{outcome.why}{steps}"


def print_audit(result: AuditResult, console: Console) -> None:
    """The verdict in a panel, then the attacks, the changes and the facts (every text that
    comes from the setup, the private sentences or an error printed literally)."""
    style = "red" if result.exposed else "green"
    console.print(Panel(shown(result.verdict), title=shown(f"audit of {result.name}"),
                        border_style=style))  # fmt: skip
    attacks = Table(title="the setup as it is")
    for column in ("attack", "exact %", "ROUGE-2", "secrets", "what happened"):
        attacks.add_column(column, overflow="fold")
    for outcome in result.baseline:
        attacks.add_row(*(shown(cell) for cell in (outcome.attack, *outcome_text(outcome))))
    console.print(attacks)
    if result.utility is not None:
        console.print(shown(f"utility of the setup as it is (dev, after fine-tuning): "
                            f"{result.utility.text()}"), soft_wrap=True)  # fmt: skip
        if result.utility.records is not None:
            console.print(shown(f"empirical privacy of that fine-tuning: "
                                f"{result.utility.privacy_text()}"), soft_wrap=True)  # fmt: skip
    if result.mitigations:
        changes = Table(title="changes tried against the attacks that leaked")
        columns = ("change", "attack", "exact %", "ROUGE-2", "under thresholds", "utility", "notes")
        for column in columns:
            changes.add_column(column, overflow="fold")
        for mitigation in result.mitigations:
            below = mitigation.below(result.thresholds)
            mark = "not measured" if below is None else "[green]yes[/]" if below else "[red]no[/]"
            utility = shown(mitigation.utility.short_text()) if mitigation.utility else ""
            for k, outcome in enumerate(mitigation.outcomes):
                exact, rouge2, _, notes = (shown(cell) for cell in outcome_text(outcome))
                first = k == 0
                changes.add_row(shown(mitigation.change) if first else "", shown(outcome.attack),
                                exact, rouge2, mark if first else "", utility if first else "",
                                notes)  # fmt: skip
        console.print(changes)
        if result.utility is None:
            console.print("What a change costs the model was not measured (add utility: to the "
                          "setup file); for example: "
                          f"{shown(result.mitigations[-1].utility_command)}",
                          soft_wrap=True)  # fmt: skip
    t = result.thresholds
    console.print(
        shown(
            f"thresholds: exact <= {t.max_exact:g}%, ROUGE-2 <= {t.max_rouge2:g}, secret words <= "
            f"{t.max_secrets}; budget "
            f"{duration(result.budget_s)}, used {duration(result.seconds)}; results in "
            f"{result.folder} (gradleak report {result.folder})"
        ),
        soft_wrap=True,
    )


def write_audit_html(result: AuditResult, path: str | Path) -> Path:
    """The audit as one offline HTML page (every string escaped), written whole
    (:func:`~gradleak.runtime.files.write_atomic`)."""
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("gradleak.reports", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
    )  # fmt: skip
    environment.globals.update(outcome_text=outcome_text, duration=duration)
    records = result.utility.records if result.utility else None
    plot = None
    if records is not None:  # the fine-tuning's measured epsilon, round by round
        from gradleak.reports.plots import epsilon_by_round

        rounds = [{"round": r + 1, "privacy": {"records": summary}}
                  for r, summary in enumerate(records["rounds"])]  # fmt: skip
        plot = epsilon_by_round(rounds)
    html = environment.get_template("audit.html.j2").render(result=result, epsilon_plot=plot)
    return write_atomic(Path(path), html)
