"""``gradleak attack``: one attack over a scenario's inputs, its options generated from the
config models (:mod:`gradleak.cli.parameters`), the record printed (:mod:`gradleak.cli.show`)."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from gradleak.attacks.registry import ATTACKS
from gradleak.cli.console import console, err_console, fail
from gradleak.cli.parameters import attack_command_parameters
from gradleak.cli.show import print_record
from gradleak.errors import GradleakError, GradleakNotice, PluginWarning


def attack(**options: Any) -> None:
    """Attack clients of a federated fine-tuning scenario and report what leaked.

    Options come in groups: the scenario (model, data, protocol, defenses, what the server knows), the attack and its own options (`gradleak attacks NAME` lists one attack's with its defaults), and the run.
    """  # noqa: E501  one paragraph: the help reflows it
    from gradleak.api.runs import attack as gradleak_attack

    workers, out = options.pop("workers"), options.pop("out")
    stack = options.pop("stack") or 1
    backend = options.pop("backend") or "processes"
    try:
        with warnings.catch_warnings():  # the notices are printed below, with the record
            warnings.simplefilter("ignore", GradleakNotice)
            record = gradleak_attack(
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
