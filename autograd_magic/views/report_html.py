"""The reports of one or several traces as HTML and text: the comparison tables, and the
self-contained HTML document `python -m autograd_magic report` writes.

The document is one file: inline styles, figures as base64 PNG, no script and no network.
Several traces (the ranks of one job, a run before and after a fix) are laid side by side.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from autograd_magic.report.comparison import Named, findings_table, peaks_table
from autograd_magic.report.model import Report
from autograd_magic.report.watch import WatchReport
from autograd_magic.views.html import TEXT_STYLE, div, static_html, table_html, watch_page
from autograd_magic.views.text import render_text, render_watch_text, table_text

AnyNamed = Sequence[tuple[str, Report | WatchReport]]


def text_of(report: Report | WatchReport, tables: bool = True) -> str:
    """The text report of a trace's or a watch's report."""
    if isinstance(report, WatchReport):
        return render_watch_text(report, tables)
    return render_text(report, tables)


def reports_text(named: AnyNamed) -> str:
    """One report's text; several traces compared; watches one after the other."""
    if len(named) == 1:
        return text_of(named[0][1])
    if all(isinstance(r, Report) for _, r in named):
        return comparison_text(named)  # type: ignore[arg-type]
    return "\n\n".join(f"===== {name} =====\n{text_of(r)}" for name, r in named)


def comparison_text(named: Named) -> str:
    """The comparison tables, then each trace's text report under its name."""
    parts = [table_text(peaks_table(named)), table_text(findings_table(named))]
    parts += [f"===== {name} =====\n{render_text(report)}" for name, report in named]
    return "\n\n".join(parts)


def comparison_html(named: Named) -> str:
    """The two comparison tables as an HTML fragment."""
    return table_html(peaks_table(named)) + table_html(findings_table(named))


def side_by_side_html(named: Named) -> str:
    """One trace's full view, or several: comparison tables, then one column per trace."""
    if len(named) == 1:
        name, report = named[0]
        return div(f"<h2>{html.escape(name)}</h2>") + static_html(report)
    columns = "".join(
        f'<section style="flex:1 1 480px;min-width:0;border-top:3px solid #1976d2">'
        f"<h2>{html.escape(name)}</h2>{static_html(report)}</section>"
        for name, report in named
    )
    return comparison_html(named) + f'<div style="display:flex;gap:24px">{columns}</div>'


def report_document(named: AnyNamed, title: str = "autograd_magic report") -> str:
    """A complete HTML document, readable offline in any browser (no script, no links out);
    traces side by side, a watch's report as one column."""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head>"
        f'<body style="{TEXT_STYLE};margin:16px">'
        f"<h1>{html.escape(title)}</h1>{_body(named)}</body></html>\n"
    )


def _body(named: AnyNamed) -> str:
    if all(isinstance(r, Report) for _, r in named):
        return side_by_side_html(named)  # type: ignore[arg-type]
    return "".join(
        div(f"<h2>{html.escape(name)}</h2>")
        + (watch_page(r) if isinstance(r, WatchReport) else static_html(r))
        for name, r in named
    )
