"""The ``gradleak`` command line: attack a federated scenario, run the demo, list what exists."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Annotated, Any

import typer
from rich.table import Table

from gradleak import api, cli_experiments, cli_flower
from gradleak.attacks import ATTACKS
from gradleak.cli_console import console, err_console, fail
from gradleak.cli_options import attack_command_parameters, utility_command_parameters
from gradleak.data import DATASETS, dataset_status
from gradleak.defenses import DEFENSES
from gradleak.errors import GradleakError, GradleakNotice, PluginWarning
from gradleak.global_state import kept_global_state
from gradleak.models.registry import MODELS, model_status
from gradleak.options import (
    attack_defaults,
    attack_options,
    utility_from_options,
)
from gradleak.progress import progress_bar
from gradleak.record import Record

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Measure how much private text leaks from federated fine-tuning updates.",
)


def print_record(record: Record) -> None:
    """References next to reconstructions, then the run's metrics."""
    config = record.config
    title = (
        f"{config.attack.name.upper()} on {config.scenario.model} / "
        f"{config.scenario.data.dataset}: {record.scenario.label}"
    )
    table = Table(title=title, caption=record.scenario.text, show_lines=True)
    table.add_column("#", justify="right")
    table.add_column("private text (reference)")
    table.add_column("reconstruction")
    table.add_column("R-1", justify="right")
    for sample in record.samples:
        if sample.failed:
            table.add_row(str(sample.index), "", f"[red]{sample.error}[/]", "")
            continue
        r1 = f"{sample.metrics.strict.rouge1:.0f}"
        for k, (ref, exact) in enumerate(zip(sample.reference, sample.exact, strict=True)):
            match = sample.matching[k]
            pred = sample.prediction[match] if match is not None else ""
            mark = " [green](exact)[/]" if exact else ""
            table.add_row(
                str(sample.index) if k == 0 else "", ref, pred + mark, r1 if k == 0 else ""
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
        shown = "none (see the record's note)" if epsilon is None else f"{epsilon:.3g}"
        console.print(
            f"privacy: epsilon {shown} at delta {privacy.get('delta')} per client round "
            f"({privacy.get('accountant')} accountant, {steps} step{'' if steps == 1 else 's'})"
        )
    t = record.timing
    console.print(
        f"time: {t.total_s:.1f} s total, {t.update_s:.1f} s client updates, "
        f"{t.attack_s:.1f} s attacking"
    )


def attack(**options: Any) -> None:
    """Attack clients of a federated fine-tuning scenario and report what leaked.

    Options come in groups: the scenario (model, data, protocol, defenses, what the server knows), the attack and its own options (`gradleak attacks NAME` lists one attack's with its defaults), and the run.
    """  # noqa: E501  one paragraph: the help reflows it
    workers, out = options.pop("workers"), options.pop("out")
    stack = options.pop("stack") or 1
    backend = options.pop("backend") or "processes"
    try:
        with warnings.catch_warnings():  # the notices are printed below, with the record
            warnings.simplefilter("ignore", GradleakNotice)
            record = api.run(
                out=out,
                workers=1 if workers is None else workers,
                stack=stack,
                backend=backend,
                **options,
            )
    except GradleakError as exc:
        raise fail(str(exc)) from None
    print_record(record)
    for notice in record.notices:
        err_console.print(f"[yellow]notice:[/] {notice}", highlight=False, soft_wrap=True)
    if out:
        console.print(f"record written to {out}")
    errors = [s.error for s in record.samples if s.failed]
    if errors and len(errors) == len(record.samples):
        raise fail(errors[0])  # nothing could be attacked: say why in one line


@contextlib.contextmanager
def plugins_reported() -> Iterator[None]:
    """Installed plugins load when the commands' options are built, before any command runs:
    each one skipped is a warning line; a name clash is an error line and exit code 2."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PluginWarning)
        try:
            yield
        except GradleakError as exc:
            fail(str(exc))
            sys.exit(2)
    for warning in caught:
        if issubclass(warning.category, PluginWarning):
            err_console.print(f"[yellow]warning:[/] {warning.message}", highlight=False,
                              soft_wrap=True)  # fmt: skip
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)  # fmt: skip


def regenerate_attack_options() -> None:
    """Follow the registered attacks (one registered in this process later, a notebook's or a
    test's, gets its options too). A plugin's name clash is raised again where an attack is
    asked for, not here."""
    with contextlib.suppress(GradleakError):
        attack_command_parameters(attack)


with plugins_reported():
    attack_command_parameters(attack)
ATTACKS.watch(regenerate_attack_options)
app.command()(attack)


def utility(**options: Any) -> None:
    """What the scenario's protocol and defenses cost the model: federated fine-tuning with
    the same clients, then dev-split accuracy, F1 and MCC (classification) or perplexity."""
    from gradleak.utility import measure_utility, utility_record

    threads, out = options.pop("threads"), options.pop("out")
    device = options.pop("device") or "cpu"
    try:
        config, settings = utility_from_options(options)
        with (
            kept_global_state(threads),
            progress_bar("fine-tuning rounds", settings.rounds) as advance,
        ):
            result = measure_utility(config, settings, advance, device)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    table = Table(title=f"utility of {config.scenario.model} on {config.scenario.data.dataset}")
    table.add_column("round", justify="right")
    for name in result.metrics[0]:
        table.add_column(name, justify="right")
    for r, values in zip(result.rounds, result.metrics, strict=True):
        table.add_row(str(r), *(f"{v:.1f}" for v in values.values()))
    console.print(table)
    console.print(f"time: {result.seconds:.1f} s")
    if out:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(utility_record(config, settings, result), handle, indent=2)
        console.print(f"record written to {out}")


utility_command_parameters(utility)
app.command()(utility)
app.command("run")(cli_experiments.run)
app.command()(cli_experiments.export)
app.command()(cli_experiments.report)
app.command()(cli_experiments.audit)
app.command()(cli_flower.flower)


@app.command()
def attacks(
    name: Annotated[str | None, typer.Argument(help="an attack: list its options")] = None,
) -> None:
    """List the attacks, or one attack's options with its defaults."""
    if name is None:
        table = Table(title="attacks")
        for column in ("name", "from", "description"):
            table.add_column(column)
        for entry in ATTACKS.entries():
            table.add_row(entry.name, str(entry.origin), entry.description)
        console.print(table)
        console.print("`gradleak attacks NAME` lists an attack's options and defaults.")
        return
    try:
        entry = ATTACKS[name]
        defaults = attack_defaults(name)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    table = Table(title=f"{name}: {entry.description}", caption=f"from {entry.origin}")
    for column in ("option", "default", "meaning"):
        table.add_column(column)
    for option in attack_options():
        if name in option.attacks:
            table.add_row(option.flag, _shown(defaults[option.key]), option.help)
    console.print(table)


@app.command()
def defenses() -> None:
    """List the client-side defenses and their parameters (--defense NAME:KEY=VALUE,...)."""
    table = Table(title="defenses (--defense NAME:KEY=VALUE,... joined by +; none: no defense)")
    for column in ("name", "parameter", "default", "meaning"):
        table.add_column(column)
    for entry in DEFENSES.entries():
        origin = "" if entry.origin.source == "built-in" else f" (from {entry.origin})"
        table.add_row(entry.name, "", "", entry.description + origin)
        for field, info in entry.settings.model_fields.items():
            if field == "name":
                continue
            default = "required" if info.is_required() else _shown(info.default)
            table.add_row("", field, default, info.description or "")
    console.print(table)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "-" if value is None else str(value)


@app.command()
def demo(
    steps: Annotated[int, typer.Option(help="attack steps per scenario")] = 150,
    n_inputs: Annotated[int, typer.Option(help="demo sentences per scenario")] = 2,
    out: Annotated[str | None, typer.Option(help="write all records as one JSON file")] = None,
) -> None:
    """The main job: attack the built-in private sentences under scenarios that tell the story."""
    from gradleak.demo import run_demo

    try:
        records = run_demo(steps=steps, n_inputs=n_inputs, show=print_record, console=console)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    if out:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump([record.to_json() for record in records], handle, indent=2)
        console.print(f"records written to {out}")


@app.command()
def models() -> None:
    """List the models gradleak knows and whether they are present here."""
    table = Table(title="models")
    for column in ("name", "family", "status", "description"):
        table.add_column(column)
    for name, spec in MODELS.items():
        table.add_row(name, spec.family, model_status(name), spec.description)
    console.print(table)
    console.print("A local model folder also works, and hf:ORG/NAME fetches from the hub (online).")


@app.command()
def datasets(
    data_dir: Annotated[
        str | None, typer.Option(help="data folder (else $GRADLEAK_DATA_DIR)")
    ] = None,
) -> None:
    """List the datasets gradleak knows and whether their files are found."""
    table = Table(title="datasets")
    for column in ("name", "task", "status", "description"):
        table.add_column(column)
    for name, info in DATASETS.items():
        table.add_row(name, info.task, dataset_status(name, data_dir), info.description)
    console.print(table)
    console.print(
        "Your own data: --dataset file:PATH (.txt one per line, .csv or .jsonl); "
        "hf:NAME loads from the Hugging Face hub (online)."
    )
    if data_dir is None and "GRADLEAK_DATA_DIR" not in os.environ:
        console.print("No data folder given: pass --data-dir or set GRADLEAK_DATA_DIR.")
