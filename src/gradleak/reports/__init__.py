"""Reports of an experiment's results: one self-contained HTML page, or a Markdown summary
(``gradleak report RUN``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradleak.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from gradleak.reports.data import CellReport, ReportData, read_report_data
    from gradleak.reports.render import render_html, render_markdown, write_report

# loaded on first use
__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "CellReport": "gradleak.reports.data",
        "ReportData": "gradleak.reports.data",
        "read_report_data": "gradleak.reports.data",
        "render_html": "gradleak.reports.render",
        "render_markdown": "gradleak.reports.render",
        "write_report": "gradleak.reports.render",
    },
)

__all__ = [
    "CellReport",
    "ReportData",
    "read_report_data",
    "render_html",
    "render_markdown",
    "write_report",
]
