"""``gradleak run EXPERIMENT.yaml`` and ``gradleak export``: a declared grid of runs into one
results database, and any cell of it back out as a single run's JSON record."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import TaskID
from rich.table import Table

from gradleak.cli.console import console, err_console, fail, shown
from gradleak.errors import GradleakError, one_line
from gradleak.experiments.estimate import duration
from gradleak.runtime.files import write_atomic
from gradleak.runtime.progress import bars

if TYPE_CHECKING:  # the commands import what they run when they run it
    from gradleak.experiments import ExperimentDatabase
    from gradleak.experiments.execute import Experiment, ExperimentRun, GridProgress
    from gradleak.experiments.utility import UtilityProgress
    from gradleak.running.plan import RunPlan


def run(
    experiment: Annotated[Path, typer.Argument(help="the experiment file (YAML)")],
    out: Annotated[
        Path | None, typer.Option(help="results folder (default: runs/NAME); resumes there")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="list the cells and their cost; run nothing")
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option(help="inputs attacked at once, in processes (default: planned per cell)"),
    ] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or mps")] = "cpu",
    limit: Annotated[
        int | None, typer.Option(help="run at most the first N inputs of each cell")
    ] = None,
    data_dir: Annotated[
        str | None, typer.Option(help="data folder of cells that set none (else env)")
    ] = None,
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads of each process (default: planned)")
    ] = None,
    stack: Annotated[
        str | None,
        typer.Option(
            help="inputs optimized together in one batched pass: N or auto "
            "(default: planned per cell)"
        ),
    ] = None,
    backend: Annotated[
        str, typer.Option(help="what runs the workers: processes, or ray (Ray actors)")
    ] = "processes",
    ray_address: Annotated[
        str | None, typer.Option(help="--backend ray: join the cluster at HOST:PORT")
    ] = None,
    only: Annotated[
        str | None, typer.Option(help="run only the cells whose name contains this text")
    ] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="KEY=VALUE: set an option in every cell over the file's value (its fixed "
            "setting, axis or include rules), e.g. --set n_inputs=3; repeatable",
        ),
    ] = None,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep",
            help="then write every cell's finished inputs to the file's kept: folder (a "
            "fresh checkout's run resumes from them)",
        ),
    ] = False,
) -> None:
    """Run a declared experiment: the grid of its fixed settings and axes, each finished
    input kept in one SQLite database (re-running resumes). Cells it holds nothing of first
    take in their inputs kept in the file's kept: folder, or the same run from another
    results folder beside it."""
    from gradleak.experiments import load_experiment, run_experiment

    try:
        loaded = load_experiment(experiment, data_dir, overrides_of(sets or []))
        if dry_run:
            show_plan(loaded, out, only)
            return
        loaded.chosen(only)  # a name no cell has: said before anything starts
        from gradleak.runtime.state import kept_global_state  # (torch) once the file is read

        with kept_global_state(threads), grid_progress(loaded.name) as (progress, utility):
            result = run_experiment(loaded, out, workers=workers, device=device, limit=limit,
                                    threads=threads, on_plan=_print_cell_plan,
                                    progress=progress, utility_progress=utility,
                                    stack=stack, backend=backend, ray_address=ray_address,
                                    only=only, keep=keep)  # fmt: skip
    except GradleakError as exc:
        raise fail(str(exc)) from None
    show_result(loaded, result)
    if result.errors:
        raise fail(f"{len(result.errors)} of {len(loaded.cells)} cells failed (see above)")


def _print_cell_plan(cell: str, plan: RunPlan) -> None:
    if plan.workers > 1 or plan.stack > 1:  # more than one input at a time in this process
        err_console.print(f"{shown(cell)}: {shown(plan.text)}", highlight=False, soft_wrap=True)


MAX_SET_CHARS = 1000  # one --set value: an option's, never a document


def overrides_of(sets: list[str]) -> dict[str, object]:
    """``--set KEY=VALUE`` options by key, each value read as YAML reads one (``3`` a
    number, ``null`` not given, ``'noise:sigma=0.01'`` text); a value YAML would read with
    aliases, or cannot read, is its text."""
    import yaml

    overrides: dict[str, object] = {}
    for given in sets:
        key, equals, text = given.partition("=")
        if not equals or not key.strip():
            raise GradleakError(
                f"--set {one_line(given[:80])}: give KEY=VALUE, e.g. --set n_inputs=3"
            )
        if len(text) > MAX_SET_CHARS:
            raise GradleakError(
                f"--set {one_line(key[:40])}: a value of {len(text)} characters, over the "
                f"{MAX_SET_CHARS} an option takes"
            )
        try:
            aliased = any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text))
            value = text if aliased else yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        overrides[key.strip()] = value
    return overrides


def show_plan(experiment: Experiment, out: Path | None, only: str | None = None) -> None:
    """The cells, what the results folder holds of each (or would take in from the kept
    folder or another experiment), and the rest's estimated cost."""
    from gradleak.experiments import plan
    from gradleak.experiments.utility import utility_key

    folder = out or experiment.default_out()
    planned = plan(experiment, folder, only)
    chosen = len(planned.cells)
    count = f"{chosen} of {len(experiment.cells)}" if chosen < len(experiment.cells) else chosen
    table = Table(title=shown(f"{experiment.name}: {count} cells -> {folder}"))
    table.add_column("cell", overflow="fold")
    for column in ("attack", "model", "dataset", "B", "inputs done", "estimate"):
        table.add_column(column, justify="right" if column in ("B", "inputs done") else "left")
    for cell, status, estimate in planned.cells:
        scenario = cell.config.scenario
        done = 0 if status is None else status.done
        cost = duration(estimate.seconds) + ("" if estimate.measured else " ~")
        names = (cell.name, cell.config.attack.name, scenario.model, scenario.data.dataset)
        table.add_row(*(shown(name) for name in names), str(scenario.data.batch_size),
                      f"{done}/{scenario.data.n_inputs}", cost)  # fmt: skip
    console.print(table)
    dropped = sorted({f"{key} ({c.config.attack.name})" for c, _, _ in planned.cells
                      for key in c.dropped})  # fmt: skip
    if dropped:
        console.print(shown(f"not used by the attack of some cells: {', '.join(dropped)}"))
    console.print(
        f"{planned.remaining_inputs} inputs to run, about {duration(planned.seconds)} on one "
        "CPU core (~: the attack's measured cost on a 2-core CPU, scaled; without ~: this "
        "cell's finished inputs). Nothing was run."
    )
    if experiment.kept is not None:
        console.print(shown(f"kept inputs: {experiment.kept} (taken in before anything runs)"))
    if experiment.utility is not None:
        scenarios = {utility_key(c.config, experiment.utility) for c, _, _ in planned.cells}
        console.print(f"then {len(scenarios)} utility fine-tuning(s), one per distinct scenario "
                      "(not in the estimate; a stored one is not run again)")  # fmt: skip


@contextlib.contextmanager
def grid_progress(name: str) -> Iterator[tuple[GridProgress, UtilityProgress]]:
    """Bars on stderr: the grid's cells and its inputs (with the ETA), then the utility
    fine-tunings when the experiment asks for them."""
    with bars(err_console) as progress:
        cells = progress.add_task(shown(f"{name}: cells"), total=None)
        inputs = progress.add_task("inputs", total=None)
        fine_tunings: list[TaskID] = []

        def advance(index: int, count: int, done: int, total: int, cell: str) -> None:
            progress.update(cells, completed=index, total=count)
            progress.update(inputs, completed=done, total=total,
                            description=shown(f"inputs of {cell}"))  # fmt: skip

        def utility(done: int, total: int, scenario: str) -> None:
            if not fine_tunings:
                fine_tunings.append(progress.add_task("utility", total=total))
            progress.update(fine_tunings[0], completed=done,
                            description=shown(f"utility: {scenario}"))  # fmt: skip

        yield advance, utility


def show_result(experiment: Experiment, result: ExperimentRun) -> None:
    """Each cell's scores, or why it failed."""
    table = Table(title=shown(f"{experiment.name} -> {result.folder}"))
    table.add_column("cell", overflow="fold")
    for column in ("inputs", "R-1", "R-2", "exact %", "s/input"):
        table.add_column(column, justify="right")
    for cell in experiment.cells:
        if cell.name not in result.records and cell.name not in result.errors:
            continue  # not chosen (--only)
        if cell.name in result.errors:
            error = shown(result.errors[cell.name])
            table.add_row(shown(cell.name), "", f"[red]{error}[/]", "", "", "")
            continue
        record = result.records.get(cell.name)
        if record is None:
            table.add_row(shown(cell.name), "part-way", "", "", "", "")
            continue
        strict = record.metrics.strict
        seconds = record.timing.attack_s / max(1, len(record.samples))
        scores = (
            ("-", "-", "-")
            if strict is None
            else (f"{strict.rouge1:.1f}", f"{strict.rouge2:.1f}", f"{strict.exact_match:.1f}")
        )
        table.add_row(shown(cell.name), str(len(record.samples)), *scores, f"{seconds:.1f}")
    console.print(table)
    sources = sorted({str(source.parent if source.is_file() else source)
                      for source in result.adopted.values()})  # fmt: skip
    if result.adopted:
        console.print(shown(f"took in {len(result.adopted)} cells' earlier inputs from "
                            f"{', '.join(sources)}"))  # fmt: skip
    if result.kept:
        console.print(shown(f"kept {len(result.kept)} cells' finished inputs in {experiment.kept}"))
    for cell, versions in result.mixed_code.items():
        ran = ", ".join(f"{code} ({count})" for code, count in versions.items())
        console.print(f"[yellow]{shown(f'{cell}: its inputs ran on different code: {ran}')}[/]")
    for scenario, problem in result.utility_errors.items():
        console.print(f"[red]{shown(f'utility of {scenario}: {problem}')}[/]")
    console.print(
        shown(f"time: {duration(result.seconds)}; results in {result.folder / 'results.sqlite'}")
    )


def export(
    results: Annotated[Path, typer.Argument(help="a results folder `gradleak run` wrote")],
    cell: Annotated[
        str | None, typer.Argument(help="the cell's name (omit: list the cells)")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="write the record here (else stdout)")] = None,
) -> None:
    """A cell's record as `gradleak attack --out` writes it, or the list of cells."""
    from gradleak.experiments import ExperimentDatabase

    try:
        with ExperimentDatabase(results, create=False) as database:
            if cell is None:
                show_cells(database)
                return
            record = database.record(cell)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    if record is None:
        raise fail(f"cell {cell} is part-way: run the experiment again to finish it")
    text = json.dumps(record.to_json(), indent=2) + "\n"
    if out is None:
        print(text, end="")
        return
    try:
        write_atomic(out, text)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    err_console.print(f"record written to {shown(out)}")


def show_cells(database: ExperimentDatabase) -> None:
    """The cells a results database holds and how far each got."""
    table = Table(title=shown(f"cells in {database.folder}"))
    table.add_column("cell", overflow="fold")
    for column in ("inputs done", "failed", "finished"):
        table.add_column(column)
    for status in database.statuses():
        finished = "yes" if status.finished else "no"
        table.add_row(shown(status.name), f"{status.done}/{status.wanted}", str(status.failed),
                      finished)  # fmt: skip
    console.print(table)


def report(
    results: Annotated[Path, typer.Argument(help="a results folder `gradleak run` wrote")],
    out: Annotated[
        Path | None, typer.Option(help="the report's file (default: RESULTS/report.html or .md)")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="html (one offline file) or md")] = "html",
) -> None:
    """A report of an experiment's results: the papers' layout with the published figures
    beside ours, plots, every reconstruction with what it recovered, and the setup."""
    from gradleak.reports import write_report

    if fmt not in ("html", "md"):
        raise fail(f"unknown report format {fmt!r}: use --format html or --format md")
    try:
        path = write_report(results, out, fmt)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    console.print(f"report written to {shown(path)}")


def audit(
    setup: Annotated[Path, typer.Argument(help="your setup (YAML: setup:, sample:, sensitive:)")],
    budget: Annotated[
        str, typer.Option(help="time for the whole audit: 600, 90s, 10m, 1h")
    ] = "10m",
    max_exact: Annotated[
        float, typer.Option(help="accepted % of sentences recovered exactly")
    ] = 0.0,
    max_rouge2: Annotated[float, typer.Option(help="accepted ROUGE-2 (strict, percent)")] = 10.0,
    max_secrets: Annotated[
        int, typer.Option(help="accepted secret words recovered (the setup's sensitive:)")
    ] = 0,
    attacks: Annotated[
        str, typer.Option(help="attacks to try, comma-separated")
    ] = "dager,lamp-cos,tag",
    out: Annotated[
        Path | None, typer.Option(help="results folder (default runs/audit-NAME)")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
) -> None:
    """Audit your own federated fine-tuning setup: the attacks that apply, what they recover,
    and which changes bring the leakage under your thresholds. Writes audit.html and
    report.html in the results folder."""
    from gradleak.audit.setup import read_setup
    from gradleak.audit.show import parse_budget

    try:
        seconds = parse_budget(budget)
    except ValueError as exc:
        raise fail(f"--budget: {exc}") from None
    chosen = [a.strip() for a in attacks.split(",") if a.strip()]
    try:
        read_setup(setup)  # a bad setup file answers before torch loads
        from gradleak.audit import Thresholds, run_audit
        from gradleak.audit.show import print_audit, write_audit_html
        from gradleak.reports import write_report
        from gradleak.runtime.state import kept_global_state

        with kept_global_state(threads), err_console.status("auditing") as status:
            result = run_audit(setup, out, budget_s=seconds, attacks=chosen,
                               thresholds=Thresholds(max_exact, max_rouge2, max_secrets),
                               say=lambda message: status.update(message))  # fmt: skip
        report = write_report(result.folder)
        page = write_audit_html(result, result.folder / "audit.html")
    except GradleakError as exc:
        raise fail(str(exc)) from None
    print_audit(result, console)
    console.print(shown(f"wrote {page} and {report}"))
