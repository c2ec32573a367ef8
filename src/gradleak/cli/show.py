"""A run's record on the terminal: each private text beside its reconstruction, then the
run's scores, privacy and time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from gradleak.cli.console import console, shown

if TYPE_CHECKING:
    from gradleak.running.record import Record


def print_record(record: Record) -> None:
    """References next to reconstructions, then the run's metrics."""
    config = record.config
    title = shown(
        f"{config.attack.name.upper()} on {config.scenario.model} / "
        f"{config.scenario.data.dataset}: {record.scenario.label}"
    )
    table = Table(title=title, caption=shown(record.scenario.text), show_lines=True)
    table.add_column("#", justify="right")
    table.add_column("private text (reference)")
    table.add_column("reconstruction")
    table.add_column("R-1", justify="right")
    for sample in record.samples:
        if sample.failed:
            table.add_row(str(sample.index), "", f"[red]{shown(sample.error)}[/]", "")
            continue
        r1 = f"{sample.metrics.strict.rouge1:.0f}"
        for k, (ref, exact) in enumerate(zip(sample.reference, sample.exact, strict=True)):
            match = sample.matching[k]
            pred = shown(sample.prediction[match]) if match is not None else ""
            mark = " [green](exact)[/]" if exact else ""
            table.add_row(
                str(sample.index) if k == 0 else "", shown(ref), pred + mark, r1 if k == 0 else ""
            )
    console.print(table)
    s, p = record.metrics.strict, record.metrics.paper
    if s is not None and p is not None:
        console.print(
            f"strict: ROUGE-1 {s.rouge1:.1f}  ROUGE-2 {s.rouge2:.1f}  ROUGE-L {s.rougeL:.1f}  "
            f"token acc {s.token_accuracy:.1f}  exact {s.exact_match:.1f}   paper-compatible: "
            f"R-1 {p.rouge1:.1f}  R-2 {p.rouge2:.1f}  R-L {p.rougeL:.1f}"
        )
    privacy = next((s.info["privacy"] for s in record.samples if "privacy" in s.info), None)
    if privacy is not None:
        epsilon, steps = privacy.get("epsilon"), privacy.get("steps")
        value = "none (see the record's note)" if epsilon is None else f"{epsilon:.3g}"
        console.print(
            shown(
                f"privacy: epsilon {value} at delta {privacy.get('delta')} per client round "
                f"({privacy.get('accountant')} accountant, {steps} step{'' if steps == 1 else 's'})"
            )
        )
    t = record.timing
    console.print(
        f"time: {t.total_s:.1f} s total, {t.update_s:.1f} s client updates, "
        f"{t.attack_s:.1f} s attacking"
    )
