"""Reports of one or several traces: the comparison tables (peaks, findings per trace) and the
self-contained HTML document `python -m autograd_magic report` writes.

The document is one file: inline styles, figures as base64 PNG, no script and no network.
Several traces (the ranks of one job, a run before and after a fix) are laid side by side.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from autograd_magic.analysis.layout import DEFAULT_MAX_NODES
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import format_bytes
from autograd_magic.views.html import TEXT_STYLE, div, static_html, table_html
from autograd_magic.views.text import Table, render_text, table_text

Named = Sequence[tuple[str, Trace]]
MESSAGE_CHARS = 160


def peaks_table(named: Named) -> Table:
    """One row per trace: peak retained bytes and live nodes, what was left, findings, error."""
    rows = []
    for name, trace in named:
        s = trace.snapshot()
        rows.append(
            (
                name,
                format_bytes(s.peak_retained_bytes),
                f"{s.peak_live_nodes:,}",
                format_bytes(s.retained_bytes),
                f"{s.live_nodes:,}",
                f"{len(trace.findings):,}",
                trace.error or "",
            )
        )
    headers = (
        "Trace",
        "Peak retained",
        "Peak live nodes",
        "Retained at end",
        "Live nodes at end",
        "Findings",
        "Error",
    )
    return Table("Traces side by side", headers, tuple(rows), "")


def findings_table(named: Named) -> Table:
    """Which finding (kind at a line) appears in which trace, with its bytes there."""
    keys: dict[tuple[str, int | None], str] = {}
    seen: dict[tuple[str, int | None], dict[int, int]] = {}
    for index, (_, trace) in enumerate(named):
        for finding in trace.findings:
            key = (finding.kind, finding.line)
            keys.setdefault(key, finding.message)
            per_trace = seen.setdefault(key, {})
            per_trace[index] = per_trace.get(index, 0) + finding.nbytes
    rows = []
    for (kind, line), message in keys.items():
        hits = seen[(kind, line)]
        short = message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 1] + "…"
        marks = [
            ("yes" + (f" ({format_bytes(hits[i])})" if hits[i] else "")) if i in hits else "-"
            for i in range(len(named))
        ]
        rows.append((kind, "" if line is None else str(line), *marks, short))
    headers = ("Finding", "Line", *(name for name, _ in named), "Message (first trace with it)")
    note = "" if rows else "No trace has findings."
    return Table("Findings per trace", headers, tuple(rows), note)


def comparison_text(named: Named) -> str:
    """The comparison tables, then each trace's text report under its name."""
    parts = [table_text(peaks_table(named)), table_text(findings_table(named))]
    parts += [f"===== {name} =====\n{render_text(trace)}" for name, trace in named]
    return "\n\n".join(parts)


def comparison_html(named: Named) -> str:
    """The two comparison tables as an HTML fragment."""
    return table_html(peaks_table(named)) + table_html(findings_table(named))


def side_by_side_html(named: Named, max_nodes: int = DEFAULT_MAX_NODES) -> str:
    """One trace's full view, or several: comparison tables, then one column per trace."""
    if len(named) == 1:
        name, trace = named[0]
        return div(f"<h2>{html.escape(name)}</h2>") + static_html(trace, max_nodes)
    columns = "".join(
        f'<section style="flex:1 1 480px;min-width:0;border-top:3px solid #1976d2">'
        f"<h2>{html.escape(name)}</h2>{static_html(trace, max_nodes)}</section>"
        for name, trace in named
    )
    return comparison_html(named) + f'<div style="display:flex;gap:24px">{columns}</div>'


def report_document(named: Named, title: str = "autograd_magic report") -> str:
    """A complete HTML document, readable offline in any browser (no script, no links out)."""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head>"
        f'<body style="{TEXT_STYLE};margin:16px">'
        f"<h1>{html.escape(title)}</h1>{side_by_side_html(named)}</body></html>\n"
    )
