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

from gradleak import __version__
from gradleak.experiments.published import Figure, Published
from gradleak.reports.data import CellReport, ReportData, read_report_data
from gradleak.reports.highlight import marked
from gradleak.reports.plots import plots

STRICT = (("rouge1", "R-1"), ("rouge2", "R-2"), ("rougeL", "R-L"),
          ("token_accuracy", "token acc"), ("exact_match", "exact %"))  # fmt: skip
PAPER = (("rouge1", "R-1"), ("rouge2", "R-2"), ("rougeL", "R-L"))


@dataclass(frozen=True)
class Pivot:
    """The papers' layout: a row per attack, a column per combination of the other labels;
    ``entries[row][column]`` is the cell there, if any. ``published[row][column]`` are the
    published figures of attacks the grid did not run, in the same columns (the paper's
    baselines beside ours)."""

    rows: list[str]
    columns: list[str]
    entries: dict[str, dict[str, CellReport]]
    published: dict[str, dict[str, Figure]]


def pivot(cells: list[CellReport], figures: Published | None = None) -> Pivot:
    entries: dict[str, dict[str, CellReport]] = {}
    columns: list[str] = []
    for cell in cells:
        row = cell.config.attack.name
        column = ", ".join(f"{k}={v}" for k, v in cell.labels.items() if k != "attack") or "all"
        entries.setdefault(row, {})[column] = cell
        if column not in columns:
            columns.append(column)
    published: dict[str, dict[str, Figure]] = {}
    for figure in figures.figures if figures else []:
        attack = str(figure.where.get("attack", ""))
        if not attack or attack in entries:
            continue
        for row in entries.values():
            for column, cell in row.items():
                if figure.matches_except_attack(cell.config):
                    label = f"{attack} ({figure.model or 'published'})"
                    published.setdefault(label, {}).setdefault(column, figure)
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


def write_report(folder: str | Path, out: str | Path | None = None, fmt: str = "html") -> Path:
    """Render the report of results ``folder`` to ``out`` (default: ``folder/report.html``
    or ``report.md``) and return its path."""
    if fmt not in ("html", "md"):
        raise ValueError(f"unknown report format {fmt!r}: use html or md")
    data = read_report_data(folder)
    text = render_html(data) if fmt == "html" else render_markdown(data)
    path = Path(out) if out is not None else Path(folder) / f"report.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
