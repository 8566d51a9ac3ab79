"""Static HTML of a `Report`: what saved notebooks, nbconvert and frontends without widgets show.

Plain strings lowered from the report's status, sentences and tables; figures are embedded as
PNG. Never imports ipywidgets (the panel builds on these pieces, not the reverse).
"""

from __future__ import annotations

import base64
import html
import io

from autograd_magic.report.model import STATIC_TABLE_ROWS, Report, Sentence, Status, Table
from autograd_magic.report.watch import WatchReport

# JupyterLab theme variables keep the panel readable in light and dark themes; the fallbacks
# serve static HTML outside JupyterLab.
TEXT_STYLE = (
    "color:var(--jp-ui-font-color1,#222);font-family:var(--jp-ui-font-family,sans-serif);"
    "font-size:var(--jp-ui-font-size1,13px);line-height:1.45"
)
MUTED_STYLE = "color:var(--jp-ui-font-color2,#666)"
BORDER = "var(--jp-border-color2,#ccc)"
HEAD_STYLE = "background:var(--jp-layout-color2,#f0f0f0)"
MARKS = {
    "error": "border-left:4px solid var(--jp-error-color1,#d32f2f);padding-left:6px",
    "blindspot": "border-left:4px solid var(--jp-warn-color1,#f57c00);padding-left:6px",
    "finding": "border-left:4px solid var(--jp-brand-color1,#1976d2);padding-left:6px",
    "note": "border-left:4px solid var(--jp-border-color1,#999);padding-left:6px",
}
FLAG_STYLE = "color:var(--jp-warn-color1,#e65100);font-weight:bold"


def div(inner: str, style: str = "") -> str:
    return f'<div style="{TEXT_STYLE};{style}">{inner}</div>'


def status_html(status: Status) -> str:
    if status.state == "error":
        # The findings give PyTorch's text (the traceback too): here only its type and line.
        at = f" at {html.escape(status.error_where)}" if status.error_where else ""
        text = f"Stopped by {html.escape(status.error_type)}{at}"
        return div(f"<b>autograd_magic</b> &mdash; {text}", MARKS["error"])
    if status.state == "finished":
        return div("<b>autograd_magic</b> &mdash; finished", MARKS["note"])
    last = status.last_line
    where = f", last event at line {last}" if last else ""
    return div(f"<b>autograd_magic</b> &mdash; running{where}&hellip;", MARKS["finding"])


def progress_html(text: str) -> str:
    """A running watch's status line: what its counted steps show so far."""
    return div(
        f"<b>autograd_magic</b> &mdash; running: {html.escape(text)}&hellip;", MARKS["finding"]
    )


def summary_html(summary: tuple[tuple[str, str], ...]) -> str:
    cells = "".join(
        f'<div style="padding:2px 14px 2px 0">'
        f'<span style="{MUTED_STYLE}">{html.escape(label)}</span>'
        f"<br><b>{html.escape(value)}</b></div>"
        for label, value in summary
    )
    return div(cells, "display:flex;flex-wrap:wrap;margin:4px 0")


def sentences_html(items: list[Sentence], title: str) -> str:
    if not items:
        return ""
    rows = "".join(
        f'<li style="list-style:none;margin:3px 0;{MARKS[s.kind]}">{html.escape(s.text)}</li>'
        for s in items
    )
    return div(f"<b>{html.escape(title)}</b><ul style='padding-left:0;margin:2px 0'>{rows}</ul>")


def first_rows(table: Table, limit: int = STATIC_TABLE_ROWS, live_rows: int | None = None) -> Table:
    """`table` cut to `limit` rows for saved outputs, saying how many the live panel beside
    them lists (`live_rows`; None where there is no live panel, as in a script's report)."""
    if len(table.rows) <= limit:
        return table
    note = f"Showing {limit} of {len(table.rows):,} rows in this saved output"
    note += f"; the live panel lists up to {live_rows:,}." if live_rows else "."
    note = f"{note} {table.note}".strip()
    return Table(table.title, table.headers, table.rows[:limit], note, table.flag)


NOWRAP_CHARS = 32


def first_sentences(
    items: list[Sentence], what: str, limit: int = STATIC_TABLE_ROWS
) -> list[Sentence]:
    """The first `limit` sentences and every error after them, then a note on how many more."""
    if len(items) <= limit:
        return items
    kept = items[:limit] + [s for s in items[limit:] if s.kind == "error"]
    more = len(items) - len(kept)
    note = f"{more:,} more {what} like these; the text report lists every one."
    return [*kept, Sentence(note, None, "note")]


def _nowrap(text: str) -> str:
    """Short cells (`12.0 MiB`, a shape, a bar) stay on one line; long ones may wrap."""
    return ";white-space:nowrap" if len(text) <= NOWRAP_CHARS else ""


def table_html(table: Table) -> str:
    """A bordered HTML table; rows with a non-empty cell in the table's `flag` column are
    flagged."""
    flag_column = table.flag
    if not table.rows:
        return div(f"<b>{html.escape(table.title)}</b>: none", "margin:6px 0")
    cell = f"border:1px solid {BORDER};padding:2px 6px;text-align:left"
    head = "".join(f'<th style="{cell};{HEAD_STYLE}">{html.escape(h)}</th>' for h in table.headers)
    body = []
    for row in table.rows:
        flagged = flag_column is not None and bool(row[flag_column])
        style = f"{cell};{FLAG_STYLE}" if flagged else cell
        cells = (f'<td style="{style}{_nowrap(c)}">{html.escape(c)}</td>' for c in row)
        body.append("<tr>" + "".join(cells))
    note = f'<div style="{MUTED_STYLE}">{html.escape(table.note)}</div>' if table.note else ""
    return div(
        f"<b>{html.escape(table.title)}</b>"
        # A wide table scrolls sideways in its own box rather than being cut by the panel.
        f'<div style="overflow-x:auto"><table style="border-collapse:collapse;margin:4px 0">'
        f"<tr>{head}</tr>{''.join(body)}</table></div>{note}",
        # As wide as the panel, never as wide as the table: inside a widget (a flex item that
        # grows to its content) the note would run on past the panel's edge, off screen.
        "margin:6px 0;width:0;min-width:100%",
    )


def compact_png(png: bytes, colors: int = 64) -> bytes:
    """`png` reduced to an adaptive palette (transparency kept): a third of the size, for outputs
    saved in notebooks. Returns `png` unchanged when it cannot be decoded."""
    from PIL import Image  # matplotlib's own dependency; imported only for static output

    try:
        image = Image.open(io.BytesIO(png)).convert("RGBA")
    except OSError:
        return png
    buffer = io.BytesIO()
    image.quantize(colors=colors, method=Image.Quantize.FASTOCTREE).save(
        buffer, format="png", optimize=True
    )
    return buffer.getvalue() if buffer.tell() < len(png) else png


def png_img_html(png: bytes, alt: str) -> str:
    """An <img> tag embedding `png` as base64 in a compact palette, for static HTML."""
    data = base64.b64encode(compact_png(png)).decode("ascii")
    return (
        f'<img alt="{html.escape(alt)}" style="max-width:100%" src="data:image/png;base64,{data}"/>'
    )


def page(
    report: Report, timeline_png: bytes = b"", graph_png: bytes = b"", graph_note: str = ""
) -> str:
    """The whole report as one HTML fragment: status, summary, findings, timeline, backward
    calls, graph and (cut) tables; pictures given as PNG bytes are embedded."""
    parts = [
        status_html(report.status),
        summary_html(report.summary),
        sentences_html(list(report.sentences), "Findings"),
    ]
    if timeline_png:
        parts.append(png_img_html(timeline_png, "memory timeline"))
    calls = first_sentences(list(report.backward_calls), "backward calls")
    parts.append(sentences_html(calls, "Backward calls"))
    if graph_png:
        parts += [
            div(html.escape(graph_note), MUTED_STYLE),
            png_img_html(graph_png, "autograd graph"),
        ]
    if report.finished:
        live = report.live_rows
        parts += [table_html(first_rows(t, live_rows=live)) for t in report.page_tables()]
    return f'<div style="{TEXT_STYLE}">' + "".join(parts) + "</div>"


def static_html(report: Report) -> str:
    """The finished report as static HTML, drawing the timeline and graph pictures."""
    from autograd_magic.views.figures import figure_png, graph_figure, timeline_figure

    view = report.graph.view
    return page(
        report,
        figure_png(timeline_figure(report.timeline)),
        figure_png(graph_figure(view)),
        report.graph.note(view),
    )


def watch_page(report: WatchReport) -> str:
    """A watched block's report as one HTML fragment: the post-mortem, what the counted steps
    show, the steps table, then each capture window's static report under its title."""
    parts = [
        div(f"<b>autograd_magic watch</b> &mdash; {html.escape(report.state)}", MARKS["note"]),
        sentences_html(list(report.out_of_memory), "Out of memory"),
        sentences_html(list(report.sentences), "Steps"),
        table_html(report.steps),
    ]
    for window in report.windows:
        title = div(f"<h3>{html.escape(window.title)}</h3>")
        if window.report.findings:
            parts.append(title + static_html(window.report))
        else:  # its pictures would cost 0.1-0.3 s at the end of every long loop, explaining nothing
            parts.append(title + page(window.report) + div(NO_PICTURES, MUTED_STYLE))
    return f'<div style="{TEXT_STYLE}">' + "".join(parts) + "</div>"


NO_PICTURES = (
    "No findings in these steps, so no pictures (drawing them takes 0.1-0.3 s): the window's "
    "`Trace`, in the watch result's `windows`, draws them when displayed."
)
