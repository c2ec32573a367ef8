"""``gradleak attack``: one attack over a scenario's inputs, its options generated from the
config models (:mod:`gradleak.cli.parameters`), the record printed (:mod:`gradleak.cli.show`)."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gradleak.attacks.registry import ATTACKS
from gradleak.cli.console import console, err_console, fail, shown
from gradleak.cli.parameters import attack_command_parameters
from gradleak.cli.show import print_record
from gradleak.errors import GradleakError, GradleakNotice, PluginWarning

if TYPE_CHECKING:
    from gradleak.running.plan import RunPlan


def attack(**options: Any) -> None:
    """Attack clients of a federated fine-tuning scenario and report what leaked.

    Options come in groups: the scenario (model, data, protocol, defenses, what the server knows), the attack and its own options (`gradleak attacks NAME` lists one attack's with its defaults), and the run.
    """  # noqa: E501  one paragraph: the help reflows it
    from gradleak.api.runs import attack as gradleak_attack

    out, backend = options.pop("out"), options.pop("backend") or "processes"
    try:
        with warnings.catch_warnings(record=True) as caught:  # printed below, with the record
            warnings.simplefilter("always", GradleakNotice)
            record = gradleak_attack(out=out, backend=backend, on_plan=print_plan, **options)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    print_record(record)
    errors = [s.error for s in record.samples if s.failed]
    nothing = errors and len(errors) == len(record.samples)
    said = [str(w.message) for w in caught if issubclass(w.category, GradleakNotice)]
    for warning in caught:  # other warnings as they would have shown
        if not issubclass(warning.category, GradleakNotice):
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)  # fmt: skip
    for notice in dict.fromkeys([*record.notices, *said]):  # the run's, and its parts' (LTI's)
        if not (nothing and notice == f"no input could be attacked: {errors[0]}"):
            err_console.print(f"[yellow]notice:[/] {shown(notice)}", highlight=False,
                              soft_wrap=True)  # fmt: skip
    if out:
        console.print(f"record written to {shown(out)}")
    if nothing:
        raise fail(errors[0])  # nothing could be attacked: say why in one line


def replay(
    record: Annotated[Path, typer.Argument(help="a record `gradleak attack --out` wrote")],
    out: Annotated[Path | None, typer.Option(help="write the new record here (resumable)")] = None,
) -> None:
    """Run a record's scenario and attack again with its plan (workers, threads, stack,
    device): on a CPU the same results come back."""
    from gradleak.api.runs import replay as gradleak_replay

    try:
        again = gradleak_replay(record, out=out)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    print_record(again)
    if out:
        console.print(f"record written to {shown(out)}")


def print_plan(plan: RunPlan) -> None:
    """The run's plan, on stderr, before the first input is attacked, where it is more than
    this process attacking one input at a time (as every run did before plans)."""
    if plan.workers > 1 or plan.stack > 1:
        err_console.print(shown(plan.text), highlight=False, soft_wrap=True)


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
            err_console.print(f"[yellow]warning:[/] {shown(warning.message)}", highlight=False,
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
