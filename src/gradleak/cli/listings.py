"""``gradleak attacks``, ``defenses``, ``models``, ``datasets``: what exists, with its options,
its origin and whether it is present here. Nothing here loads a model."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.table import Table

from gradleak.attacks.registry import ATTACKS
from gradleak.cli.console import console, fail, shown
from gradleak.config.options import attack_defaults, attack_options
from gradleak.data.sources import dataset_status
from gradleak.data.specs import DATASETS
from gradleak.defenses.registry import DEFENSES
from gradleak.errors import GradleakError
from gradleak.models.specs import MODELS, model_status


def attacks(
    name: Annotated[str | None, typer.Argument(help="an attack: list its options")] = None,
) -> None:
    """List the attacks, or one attack's options with its defaults."""
    if name is None:
        table = Table(title="attacks")
        for column in ("name", "from", "description"):
            table.add_column(column)
        for entry in ATTACKS.entries():
            table.add_row(shown(entry.name), shown(entry.origin), shown(entry.description))
        console.print(table)
        console.print("`gradleak attacks NAME` lists an attack's options and defaults.")
        return
    try:
        entry = ATTACKS[name]
        defaults = attack_defaults(name)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    table = Table(title=shown(f"{name}: {entry.description}"),
                  caption=shown(f"from {entry.origin}"))  # fmt: skip
    for column in ("option", "default", "meaning"):
        table.add_column(column)
    for option in attack_options():
        if name in option.attacks:
            table.add_row(option.flag, shown(_default(defaults[option.key])), shown(option.help))
    console.print(table)


def defenses() -> None:
    """List the client-side defenses and their parameters (--defense NAME:KEY=VALUE,...)."""
    table = Table(title="defenses (--defense NAME:KEY=VALUE,... joined by +; none: no defense)")
    for column in ("name", "parameter", "default", "meaning"):
        table.add_column(column)
    for entry in DEFENSES.entries():
        origin = "" if entry.origin.source == "built-in" else f" (from {entry.origin})"
        table.add_row(shown(entry.name), "", "", shown(entry.description + origin))
        for field, info in entry.settings.model_fields.items():
            if field == "name":
                continue
            default = "required" if info.is_required() else _default(info.default)
            table.add_row("", shown(field), shown(default), shown(info.description or ""))
    console.print(table)


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "-" if value is None else str(value)


def models() -> None:
    """List the models gradleak knows, where each comes from and whether it is present here."""
    table = Table(title="models")
    for column in ("name", "family", "from", "status", "description"):
        table.add_column(column)
    for entry in MODELS.entries():
        spec = entry.spec
        cells = (spec.name, spec.family, entry.origin, model_status(spec.name), spec.description)
        table.add_row(*(shown(cell) for cell in cells))
    console.print(table)
    console.print("A local model folder also works, and hf:ORG/NAME fetches from the hub (online).")


def datasets(
    data_dir: Annotated[
        str | None, typer.Option(help="data folder (else $GRADLEAK_DATA_DIR)")
    ] = None,
) -> None:
    """List the datasets gradleak knows, where each comes from and whether its files are
    found."""
    table = Table(title="datasets")
    for column in ("name", "task", "from", "status", "description"):
        table.add_column(column)
    for entry in DATASETS.entries():
        spec, status = entry.spec, dataset_status(entry.name, data_dir)
        cells = (spec.name, spec.task, entry.origin, status, spec.description)
        table.add_row(*(shown(cell) for cell in cells))
    console.print(table)
    console.print(
        "Your own data: --dataset file:PATH (.txt one per line, .csv or .jsonl); "
        "hf:NAME loads from the Hugging Face hub (online)."
    )
    if data_dir is None and "GRADLEAK_DATA_DIR" not in os.environ:
        console.print("No data folder given: pass --data-dir or set GRADLEAK_DATA_DIR.")
