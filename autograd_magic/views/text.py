"""The reading model of a `Trace` (summary, sentences, tables) and its plain-text rendering.

The panel lowers the same `Sentence`s and `Table`s to HTML, so text and widget always agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autograd_magic.model.trace import Trace
from autograd_magic.model.units import format_bytes, where

MAX_TABLE_ROWS = 500


@dataclass(frozen=True)
class Sentence:
    """One plain sentence for the reader; `kind` is error, finding, blindspot or note."""

    text: str
    line: int | None
    kind: str = "finding"


@dataclass(frozen=True)
class Table:
    """Rows of strings under `headers`; `note` says what was left out, never cut silently."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


def summary_items(trace: Trace) -> list[tuple[str, str]]:
    """The headline numbers as (label, value) pairs."""
    s = trace.snapshot()
    return [
        ("Live autograd nodes", f"{s.live_nodes:,} now / {s.peak_live_nodes:,} peak"),
        (
            "Retained saved tensors",
            f"{format_bytes(s.retained_bytes)} now / {format_bytes(s.peak_retained_bytes)} peak",
        ),
        ("Nodes created", f"{s.nodes_created:,}"),
        ("Tensors saved for backward", f"{s.buffers_saved:,}"),
        ("Backward calls", f"{len(trace.backward_calls)}"),
        ("Shared-storage groups", f"{len(trace.storage_groups())}"),
        ("Version bumps (in-place writes)", f"{len(trace.version_bumps)}"),
    ]


def sentences(trace: Trace) -> list[Sentence]:
    """The error, the findings, blind spots and caps, as sentences with their lines; then what
    was still alive at the end, when anything was."""
    out: list[Sentence] = []
    if trace.error:
        site = trace.error_site
        at = where(site)
        prefix = f"{at[0].upper()}{at[1:]} raised" if at else "The cell raised"
        out.append(
            Sentence(
                f"{prefix} {trace.error.rstrip('.')}. Everything recorded up to then is shown.",
                None if site is None else (site.outer_line or site.line),
                "error",
            )
        )
    for finding in trace.findings:
        text = finding.message
        if finding.line is not None:
            text = f"Line {finding.line}: {text}"
        if finding.related_lines:
            text += f" (see also {_lines(finding.related_lines)})"
        out.append(Sentence(text, finding.line, "finding"))
    for spot in trace.blindspots:
        out.append(Sentence(spot.message, spot.line, "blindspot"))
    if trace.dropped_nodes or trace.dropped_buffers or trace.dropped_events:
        out.append(
            Sentence(
                f"Record cap of {trace.max_records:,} reached: {trace.dropped_nodes:,} nodes, "
                f"{trace.dropped_buffers:,} saved tensors and {trace.dropped_events:,} in-place "
                "writes or memory links are counted but not listed.",
                None,
                "blindspot",
            )
        )
    if trace.finished and not out:
        out.append(Sentence("No findings.", None, "note"))
    if trace.finished and trace.snapshot().live_nodes:
        s = trace.snapshot()
        out.append(
            Sentence(
                f"When the cell ended, {s.live_nodes:,} autograd nodes were still alive, holding "
                f"{format_bytes(s.retained_bytes)} of saved tensors "
                f"(peak {format_bytes(s.peak_retained_bytes)}).",
                None,
                "note",
            )
        )
    return out


def backward_sentences(trace: Trace) -> list[Sentence]:
    """One sentence per backward()/grad call: flags, what it released, its error."""
    out = []
    for call in trace.backward_calls:
        flags = (("retain_graph", call.retain_graph), ("create_graph", call.create_graph))
        shown = ", ".join(f"{name}=True" for name, on in flags if on)
        where = call.site.describe()
        line = call.site.outer_line or call.line
        head = f"{where[0].upper()}{where[1:]}: {call.kind}({shown})"
        if call.error_type:
            text = f"{head} failed with {call.error_type}: {call.error}"
            out.append(Sentence(text, line, "error"))
            continue
        text = (
            f"{head} released {call.released_buffers} saved tensors, freeing "
            f"{format_bytes(call.released_bytes)} of retained memory"
        )
        if call.retain_graph:
            text += "; the graph was kept for another backward"
        out.append(Sentence(text + ".", line, "note"))
    return out


def _lines(lines: Iterable[int]) -> str:
    items = sorted(set(lines))
    return ("line " if len(items) == 1 else "lines ") + ", ".join(str(n) for n in items)


def _node_name(trace: Trace, node_id: int | None) -> str:
    node = None if node_id is None else trace.node(node_id)
    return "?" if node is None else f"{node.name}#{node.id}"


def _saved_by(trace: Trace, node_id: int | None) -> str:
    """A readable label for a saved tensor no user variable names: `saved by addmm`."""
    node = None if node_id is None else trace.node(node_id)
    if node is None:
        return "saved tensor"
    op = node.name.removesuffix("Backward0").removesuffix("Backward1").removesuffix("Backward")
    return f"saved by {op.lower() or node.name}"


def _buffer_kind(buffer: object) -> str:
    if getattr(buffer, "is_parameter", False):
        return "parameter"
    return "leaf" if getattr(buffer, "is_leaf", False) else "activation"


def buffer_table(trace: Trace, node_ids: set[int] | None = None) -> Table:
    """Saved tensors, still-held first then largest; restricted to `node_ids` when given."""
    chosen = [b for b in trace.buffers if node_ids is None or b.node_id in node_ids]
    chosen.sort(key=lambda b: (b.freed, -b.nbytes, b.id))
    rows = tuple(
        (
            _node_name(trace, b.node_id),
            b.label or _saved_by(trace, b.node_id),
            "x".join(str(d) for d in b.shape) or "scalar",
            b.dtype,
            b.device,
            format_bytes(b.nbytes),
            _buffer_kind(b),
            f"line {b.saved_line}",
            f"released ({where(b.freed_site)})" if b.freed else "held",
        )
        for b in chosen[:MAX_TABLE_ROWS]
    )
    note = ""
    if len(chosen) > MAX_TABLE_ROWS:
        note = f"Showing the first {MAX_TABLE_ROWS} of {len(chosen):,} saved tensors."
    headers = ("node", "tensor", "shape", "dtype", "device", "bytes", "kind", "saved", "state")
    return Table("Saved tensors", headers, rows, note)


def buffer_totals(trace: Trace) -> Table:
    """Counts and bytes of saved tensors by state (held / released) and kind."""
    totals: dict[tuple[str, str], list[int]] = {}
    for b in trace.buffers:
        key = ("released" if b.freed else "held", _buffer_kind(b))
        entry = totals.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += b.nbytes
    rows = tuple(
        (state, kind, f"{count:,}", format_bytes(nbytes))
        for (state, kind), (count, nbytes) in sorted(totals.items())
    )
    note = (
        "Sizes add tensor by tensor; 'retained' in the summary counts each shared storage once "
        "and leaves out leaves and parameters, which the user owns anyway."
    )
    return Table("Totals by state", ("state", "kind", "tensors", "bytes"), rows, note)


def storage_table(trace: Trace) -> Table:
    """One row per member of each shared-memory group, then its copies (separate memory)."""
    rows: list[tuple[str, ...]] = []
    for number, group in enumerate(trace.storage_groups(), start=1):
        for member in group.members:
            rows.append((f"group {number}", member, group.how.get(member, ""), "shares memory"))
        for copy, source in group.copies.items():
            rows.append((f"group {number}", copy, f"copy of {source}", "own memory (copy)"))
    headers = ("group", "tensor / array", "how it joined", "memory")
    return Table("Storage groups", headers, tuple(rows))


def versions_table(trace: Trace) -> Table:
    """In-place writes grouped per tensor, in order; writes that bypass the counter flagged."""
    bumps = sorted(trace.version_bumps, key=lambda v: (v.label, v.seq))
    rows = []
    for bump in bumps:
        if bump.bypass:
            via = f" through {bump.bypassed}" if bump.bypassed else ""
            flag = f"BYPASS{via}: version unchanged, autograd cannot see this write"
        else:
            flag = ""
        affected = ", ".join(bump.affected)
        hit = str(len(bump.hit_buffers)) if bump.hit_buffers else ""
        version = f"{bump.old} -> {bump.new}"
        rows.append((bump.label, bump.op, where(bump.site), version, affected, hit, flag))
    headers = (
        "tensor",
        "op",
        "where",
        "version",
        "aliases bumped too",
        "saved tensors hit",
        "warning",
    )
    return Table("Version bumps", headers, tuple(rows))


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


def render_text(trace: Trace) -> str:
    """The whole report as plain text: summary, sentences, backward calls and every table."""
    state = "error" if trace.error else ("finished" if trace.finished else "running")
    parts = [f"autograd_magic trace ({state})"]
    parts.append("\n".join(f"  {label}: {value}" for label, value in summary_items(trace)))
    found = sentences(trace)
    if found:
        parts.append("Findings:\n" + "\n".join(f"  - {s.text}" for s in found))
    calls = backward_sentences(trace)
    if calls:
        parts.append("Backward calls:\n" + "\n".join(f"  - {s.text}" for s in calls))
    for table in (
        buffer_totals(trace),
        buffer_table(trace),
        storage_table(trace),
        versions_table(trace),
    ):
        parts.append(table_text(table))
    return "\n\n".join(parts) + "\n"
