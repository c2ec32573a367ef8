"""The parameters of ``gradleak attack``, generated from the option table (``options``): one
typer option per config field, grouped by scenario / attack / run in ``--help``, each with its
default (per attack where the attacks differ)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from gradleak.attacks import ATTACKS
from gradleak.config.options import (
    Option,
    all_options,
    attack_defaults,
    scenario_options,
    utility_options,
)

RUN_PANEL = "Run"

# Options of the run that are not part of its config. Threads, workers and stacks change a
# result at most in the last bits of rounding; a device other than the CPU can change more (a
# GPU draws dropout masks from its own generator), so a part-way run resumes only on its own
# device. Left out, threads, workers and stack are planned (gradleak.running.plan).
RUN_OPTIONS: tuple[tuple[str, type, str], ...] = (
    (
        "threads",
        int,
        "torch CPU threads of each process (default: planned, an equal share of the cores "
        "for several workers, else torch's own)",
    ),
    (
        "workers",
        int,
        "inputs attacked at once, in worker processes (default: planned from the inputs, "
        "their cost and the cores; 1: this process only)",
    ),
    (
        "device",
        str,
        "where the model and the attack compute: cpu, cuda, cuda:N, mps (default: cpu)",
    ),
    (
        "stack",
        str,
        "inputs whose updates DLG/TAG/LAMP optimize together in one batched pass (results as "
        "one by one up to rounding): a number, or auto to pick from the machine and the "
        "lengths (default: planned; 1: one by one)",
    ),
    (
        "backend",
        str,
        "what runs the workers: processes (local) or ray (Ray actors; a local instance, or "
        "the cluster at --ray-address) (default: processes)",
    ),
    ("ray_address", str, "--backend ray: join the Ray cluster at this address (HOST:PORT)"),
    ("out", str, "write the JSON record here (resumable: run again to continue)"),
)


def _default_text(option: Option, per_attack: dict[str, dict[str, Any]]) -> str:
    if not option.attacks:
        return "" if option.default is None else f" (default: {_shown(option.default)})"
    values = {name: per_attack[name][option.key] for name in option.attacks}
    if len({repr(v) for v in values.values()}) == 1:
        value = next(iter(values.values()))
        return "" if value is None else f" (default: {_shown(value)})"
    return " (default: " + ", ".join(f"{_shown(v)} for {k}" for k, v in values.items()) + ")"


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _declaration(option: Option) -> str:
    if option.kind is bool:
        return f"{option.flag}/--no-{option.flag.removeprefix('--')}"
    return option.flag


def attack_command_parameters(command: Callable[..., Any]) -> None:
    """Give ``command`` (taking ``**options``) one keyword parameter per option, so that typer
    builds the command line from the config models."""
    set_parameters(command, list(all_options().values()), RUN_OPTIONS)


def utility_command_parameters(command: Callable[..., Any]) -> None:
    """The same for ``gradleak utility``: the scenario's options and the fine-tuning's."""
    run_options = (RUN_OPTIONS[0], RUN_OPTIONS[2], ("out", str, "write the JSON record here"))
    set_parameters(command, [*scenario_options(), *utility_options()], run_options)


def set_parameters(
    command: Callable[..., Any],
    options: list[Option],
    run_options: tuple[tuple[str, type, str], ...],
) -> None:
    """One typer option per ``Option``, then the run's own options, grouped in --help."""
    per_attack = {name: attack_defaults(name) for name in ATTACKS.names()}
    parameters = []
    # the run's own options last, after the scenario's and the attack's
    options = sorted(options, key=lambda o: o.panel == RUN_PANEL)
    for option in options:
        info = typer.Option(
            _declaration(option),
            help=option.help + _default_text(option, per_attack),
            rich_help_panel=option.panel,
            show_default=False,
        )
        annotation = Annotated[option.kind | None, info]
        parameters.append(_parameter(option.key, annotation))
    for name, kind, text in run_options:
        flag = "--" + name.replace("_", "-")
        info = typer.Option(flag, help=text, rich_help_panel=RUN_PANEL, show_default=False)
        parameters.append(_parameter(name, Annotated[kind | None, info]))
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}


def _parameter(name: str, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
    )
