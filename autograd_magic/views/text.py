"""The plain-text rendering of a `Report`: the terminal's, the command line's, and every
notebook output's text/plain fallback."""

from __future__ import annotations

from autograd_magic.report.model import TEXT_TABLE_ROWS, Report, SectionId, Table, TableId, capped
from autograd_magic.report.watch import WatchReport


def render_text(report: Report, tables: bool = True) -> str:
    """The whole report as plain text: summary, sentences, backward calls (grouped by line) and,
    unless `tables` is False, the graph's boxes and every table, each cut to `TEXT_TABLE_ROWS`
    rows with a note."""
    parts = [f"autograd_magic trace ({report.status.state})"]
    parts.append("\n".join(f"  {label}: {value}" for label, value in report.summary))
    if report.sentences:
        parts.append("Findings:\n" + "\n".join(f"  - {s.text}" for s in report.sentences))
    if report.backward_calls:
        calls = "\n".join(f"  - {s.text}" for s in report.backward_calls)
        parts.append("Backward calls:\n" + calls)
    if not tables:
        return "\n\n".join(parts) + "\n"
    drawn = report.section(SectionId.GRAPH).count > 0
    for table_id in TableId:
        if table_id is not TableId.GRAPH or drawn:
            parts.append(table_text(capped(report.table(table_id), TEXT_TABLE_ROWS)))
    return "\n\n".join(parts) + "\n"


def table_text(table: Table) -> str:
    """A column-aligned plain-text table with its title and note."""
    if not table.rows:
        return f"{table.title}: none"
    widths = [len(h) for h in table.headers]
    for row in table.rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [f"{table.title}:"]
    for row in (table.headers, *table.rows):
        lines.append(
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        )
    if table.note:
        lines.append(f"  ({table.note})")
    return "\n".join(lines)


def render_watch_text(report: WatchReport, tables: bool = True) -> str:
    """A watched block's report as plain text: what the counted steps show, the steps table,
    the out-of-memory post-mortem, then each capture window's own report under its title."""
    parts = [f"autograd_magic watch ({report.state})"]
    parts.append("\n".join(f"  - {s.text}" for s in (*report.out_of_memory, *report.sentences)))
    parts.append(table_text(report.steps))
    for window in report.windows:
        body = render_text(window.report, tables)
        parts.append(f"===== {window.title} =====\n{body.rstrip()}")
    return "\n\n".join(parts) + "\n"
