"""A results folder as one self-contained HTML file (inline CSS, inline SVG, one small inline
script allowed by a nonce, nothing fetched at view time) or as a Markdown summary.

Reconstructed text is attacker-controlled: the template escapes every string (jinja2's
autoescape), and the page's Content-Security-Policy runs no script but its own, so even a
string that escaped escaping would stay inert.
"""

from __future__ import annotations

import datetime
import secrets
from dataclasses import dataclass
from pathlib import Path

import jinja2
import yaml

from gradleak.experiments.published import Figure, Published
from gradleak.reports.data import CellReport, ReportData, read_report_data
from gradleak.reports.federation import FederationReport, is_federation, read_federation
from gradleak.reports.highlight import marked
from gradleak.reports.plots import epsilon_by_round, plots
from gradleak.runtime.files import write_atomic
from gradleak.version import __version__

STRICT = (("rouge1", "R-1"), ("rouge2", "R-2"), ("rougeL", "R-L"),
          ("token_accuracy", "token acc"), ("exact_match", "exact %"))  # fmt: skip
PAPER = (("rouge1", "R-1"), ("rouge2", "R-2"), ("rougeL", "R-L"))


# Labels that make the papers' columns; every other label sets the row apart, with the attack
COLUMN_KEYS = ("dataset", "batch_size", "defense")


@dataclass(frozen=True)
class Pivot:
    """The papers' layout: a row per attack (per attack and variant, where the grid varies
    more than datasets, batch sizes and defenses: an ablation is a row per setting), a column
    per combination of datasets, batch sizes and defenses; ``entries[row][column]`` is the
    cell there, if any. ``published[row][column]`` are the published figures of attacks the
    grid did not run, in the same columns (the paper's baselines beside ours)."""

    rows: list[str]
    columns: list[str]
    entries: dict[str, dict[str, CellReport]]
    published: dict[str, dict[str, Figure]]


def _column(cell: CellReport) -> str:
    named = [f"{k}={v}" for k, v in cell.labels.items() if k in COLUMN_KEYS]
    return ", ".join(named) or "all"


def _variant(cell: CellReport) -> str:
    named = [f"{k}={v}" for k, v in cell.labels.items() if k not in (*COLUMN_KEYS, "attack")]
    return f" [{', '.join(named)}]" if named else ""


def pivot(cells: list[CellReport], figures: Published | None = None) -> Pivot:
    entries: dict[str, dict[str, CellReport]] = {}
    columns: list[str] = []
    for cell in cells:
        row, column = cell.config.attack.name + _variant(cell), _column(cell)
        entries.setdefault(row, {})[column] = cell
        if column not in columns:
            columns.append(column)
    ran = {cell.config.attack.name for cell in cells}
    published: dict[str, dict[str, Figure]] = {}
    for figure in figures.figures if figures else []:
        attack = str(figure.where.get("attack", ""))
        if not attack or attack in ran:
            continue
        for cell in cells:
            if figure.matches_except_attack(cell.config):
                label = f"{attack} ({figure.model or 'published'}){_variant(cell)}"
                published.setdefault(label, {}).setdefault(_column(cell), figure)
    return Pivot(list(entries), columns, entries, published)


def difference(ours: float | None, figure: Figure, metric: str) -> str:
    """``+3.1`` / ``-0.4``: ours minus the published figure; empty where either is missing."""
    theirs = figure.scores().get(metric)
    if ours is None or theirs is None:
        return ""
    return f"{ours - theirs:+.1f}"


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("gradleak.reports", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.globals.update(marked=marked, difference=difference, STRICT=STRICT, PAPER=PAPER)
    environment.filters["pct"] = lambda v: "–" if v is None else f"{v:.1f}"
    environment.filters["num"] = environment.filters["pct"]
    return environment


def render_html(data: ReportData) -> str:
    """The report as one HTML page."""
    metric = data.published.metric if data.published else "paper"
    return _environment().get_template("report.html.j2").render(
        data=data, pivot=pivot(data.cells, data.published), plots=plots(data.cells), metric=metric,
        nonce=secrets.token_urlsafe(16), version=__version__,
        generated=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )  # fmt: skip


def render_markdown(data: ReportData) -> str:
    """The report's tables as Markdown, for papers and pull requests."""
    environment = _environment()
    environment.autoescape = False
    metric = data.published.metric if data.published else "paper"
    return environment.get_template("report.md.j2").render(
        data=data, pivot=pivot(data.cells, data.published), metric=metric, version=__version__
    )


def render_federation(report: FederationReport, fmt: str = "html") -> str:
    """A Flower federation's report (``gradleak flower --out``), HTML or Markdown."""
    environment = _environment()
    environment.autoescape = fmt == "html"
    setup = report.setup
    dataset = setup.get("data", {}).get("dataset", "?")
    clients = setup.get("partition", {}).get("clients", "?")
    title = (
        f"Flower federation: {setup.get('model', '?')} on {dataset}, {clients} clients, "
        f"{setup.get('rounds', '?')} rounds"
    )
    environment.globals["utility_text"] = lambda utility: (
        ", ".join(f"{k} {v:.1f}" for k, v in utility.items()) or "not measured"
    )
    return environment.get_template(f"federation.{fmt}.j2").render(
        report=report, title=title, version=__version__,
        epsilon_plot=epsilon_by_round(report.rounds) if fmt == "html" else None,
        setup_text=yaml.safe_dump(setup, sort_keys=False),
        generated=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )  # fmt: skip


def write_report(folder: str | Path, out: str | Path | None = None, fmt: str = "html") -> Path:
    """Render the report of a results folder: ``gradleak report``.

    Args:
        folder: What ``gradleak run`` (an experiment, an audit) or ``gradleak flower --out``
            wrote.
        out: The report's file (default: ``folder/report.html`` or ``report.md``).
        fmt: ``html`` (one offline page) or ``md`` (the tables as Markdown).

    Returns:
        The report's path.

    Raises:
        ValueError: An unknown ``fmt``.
        GradleakError: A folder that holds no results, or a report file that cannot be
            written (the report is written whole or not at all).
    """
    if fmt not in ("html", "md"):
        raise ValueError(f"unknown report format {fmt!r}: use html or md")
    if is_federation(folder) and not (Path(folder) / "results.sqlite").exists():
        text = render_federation(read_federation(folder), fmt)
    else:
        data = read_report_data(folder)
        text = render_html(data) if fmt == "html" else render_markdown(data)
    path = Path(out) if out is not None else Path(folder) / f"report.{fmt}"
    return write_atomic(path, text)
