"""Reports of an experiment's results: one self-contained HTML page, or a Markdown summary
(``gradleak report RUN``)."""

from gradleak.reports.data import CellReport, ReportData, read_report_data
from gradleak.reports.render import render_html, render_markdown, write_report

__all__ = [
    "CellReport",
    "ReportData",
    "read_report_data",
    "render_html",
    "render_markdown",
    "write_report",
]
