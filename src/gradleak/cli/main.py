"""The ``gradleak`` command line: one typer app, each command in the module named for it.

Every command is a call of the Python API (``gradleak attack`` is :func:`gradleak.attack`,
``gradleak run`` is :func:`gradleak.run_experiment`, ...); the command line parses options and
prints. It imports torch only in a command that computes: ``--help``, the listings and every
bad-input error answer at once.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from gradleak.cli import experiments, flower, listings
from gradleak.cli.attack import attack, replay
from gradleak.cli.console import console, fail, shown
from gradleak.cli.show import print_record
from gradleak.cli.utility import utility
from gradleak.errors import GradleakError
from gradleak.runtime.files import write_atomic
from gradleak.runtime.tuning import tune_process

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Measure how much private text leaks from federated fine-tuning updates.",
)


@app.callback()
def _start() -> None:
    """Before any command: the CPU tuning, while torch is not loaded yet."""
    tune_process()


def demo(
    steps: Annotated[int, typer.Option(help="attack steps per scenario")] = 150,
    n_inputs: Annotated[int, typer.Option(help="demo sentences per scenario")] = 2,
    out: Annotated[str | None, typer.Option(help="write all records as one JSON file")] = None,
) -> None:
    """The main job: attack the built-in private sentences under scenarios that tell the story."""
    from gradleak.running.demo import run_demo

    try:
        records = run_demo(steps=steps, n_inputs=n_inputs, show=print_record, console=console)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    if out:
        text = json.dumps([record.to_json() for record in records], indent=2) + "\n"
        try:
            write_atomic(out, text)
        except GradleakError as exc:
            raise fail(str(exc)) from None
        console.print(f"records written to {shown(out)}")


app.command()(attack)
app.command()(replay)
app.command()(utility)
app.command("run")(experiments.run)
app.command()(experiments.export)
app.command()(experiments.report)
app.command()(experiments.audit)
app.command()(flower.flower)
app.command()(demo)
app.command()(listings.attacks)
app.command()(listings.defenses)
app.command()(listings.models)
app.command()(listings.datasets)
