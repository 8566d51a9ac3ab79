"""The reading model of a `Trace` (summary, sentences, tables) and its plain-text rendering.

The panel lowers the same `Sentence`s and `Table`s to HTML, so text and widget always agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from autograd_magic.analysis.layout import GraphView, graph_view
from autograd_magic.analysis.live import NodeGrowth, built_line, node_growth
from autograd_magic.model.records import BackwardCall, Finding, NodeRecord, SavedBuffer
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import format_bytes, where
from autograd_magic.report.wording import quoted_source
from autograd_magic.views.graph_table import graph_table
from autograd_magic.views.module_table import module_table, top_modules_text
from autograd_magic.views.tables import (
    MAX_TABLE_ROWS,
    TEXT_TABLE_ROWS,
    Sentence,
    Table,
    capped,
    cut_note,
    table_text,
)
from autograd_magic.views.versions import label_pattern, versions_table


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
        ("Backward calls", f"{len(trace.backward_calls):,}"),
        ("Shared-storage groups", f"{len(trace.storage_groups())}"),
        ("Version bumps (in-place writes)", f"{len(trace.version_bumps):,}"),
        *([("Most saved memory", top)] if (top := top_modules_text(trace)) else []),
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
        out.append(Sentence(_with_lines(finding.message, finding), finding.line, "finding"))
    if not trace.finished and (growth := node_growth(trace)) is not None:
        out.append(_growth_sentence(growth, _block_word(trace)))
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
                f"When the {_block_word(trace)} ended, {s.live_nodes:,} autograd nodes were still "
                "alive, holding "
                f"{format_bytes(s.retained_bytes)} of saved tensors "
                f"(peak {format_bytes(s.peak_retained_bytes)}).",
                None,
                "note",
            )
        )
    return out


def _growth_sentence(growth: NodeGrowth, block: str) -> Sentence:
    """The provisional finding of a running trace whose live nodes grow at every step."""
    per_step = f"{growth.per_step:,.0f}" if growth.per_step >= 10 else f"{growth.per_step:.3g}"
    text = (
        f"So far, live autograd nodes grow by {per_step} per step ({growth.alive:,} alive after "
        f"{growth.steps:,} backward calls)"
    )
    line = built_line(growth)
    held = f"`{growth.holder}` holds them" if growth.holder else "something still holds it"
    if growth.built is not None:
        text += (
            f": the graph built at line {line}{quoted_source(growth.built)} stays alive after "
            f"its backward, {held}"
        )
    elif growth.holder is not None:
        text += f": `{growth.holder}` holds the graphs of the last steps"
    text += "." if growth.holder else f". The {block}'s end names the variable that holds it."
    return Sentence(text, line, "finding")


def _with_lines(text: str, finding: Finding) -> str:
    """`text` with its line in front and its related lines after, leaving out every line the
    sentence already names: "Line 7: ... at line 7" would say it twice."""
    named = named_lines(text)
    if finding.line is not None and finding.line not in named:
        text = f"Line {finding.line}: {text}"
    related = set(finding.related_lines) - named - {finding.line}
    if related:
        text += f" (see also {_lines(related)})"
    return text


# "line 7", "lines 3, 4 and 5", "lines 3-5": the numbers a sentence names as lines.
_LINE_MENTION = re.compile(r"\b[Ll]ines? (\d+(?:(?:, | and | or |-|, \.\.\. )\d+)*)")


def named_lines(text: str) -> set[int]:
    """The line numbers `text` names ("line 7", "lines 3, 4 and 5")."""
    return {int(n) for m in _LINE_MENTION.finditer(text) for n in re.findall(r"\d+", m[1])}


def _block_word(trace: Trace) -> str:
    """'cell' for a notebook or IPython cell, 'block' for a `with track():` in a script."""
    sites = [n.born_site for n in trace.nodes[:1]] + [b.saved_site for b in trace.buffers[:1]]
    for site in sites:
        return "cell" if _CELL_FILE.search(site.file) else "block"
    return "cell"


# Where IPython and ipykernel compile cells: `<ipython-input-3-...>`, `/tmp/ipykernel_7/12.py`.
_CELL_FILE = re.compile(r"^<ipython-input-|[/\\]ipykernel_\d+[/\\]")


def backward_sentences(trace: Trace) -> list[Sentence]:
    """One sentence per line and kind of backward()/grad call (flags, what each released, its
    error), in order of first call: a loop's 1,000 calls read as one sentence."""
    groups: dict[tuple, list[BackwardCall]] = {}
    for call in trace.backward_calls:
        key = (
            call.site.describe(),
            call.kind,
            call.retain_graph,
            call.create_graph,
            call.error_type,
            call.error,
        )
        groups.setdefault(key, []).append(call)
    return [_backward_sentence(calls, trace.error) for calls in groups.values()]


def _backward_sentence(calls: list[BackwardCall], stopped_by: str | None = None) -> Sentence:
    """The sentence of one group of calls; a call that failed with the error that stopped the
    block points at it, whose sentence gives PyTorch's text (said once)."""
    call = calls[0]
    flags = (("retain_graph", call.retain_graph), ("create_graph", call.create_graph))
    shown = ", ".join(f"{name}=True" for name, on in flags if on)
    at = call.site.describe()
    line = call.site.outer_line or call.line
    what = f"{call.kind}({shown})"
    head = f"{at[0].upper()}{at[1:]}: " + (
        what if len(calls) == 1 else f"{len(calls):,} {what} calls"
    )
    if call.error_type:
        every = "" if len(calls) == 1 else " each"
        if stopped_by == f"{call.error_type}: {call.error}":
            text = f"{head} failed{every} with the {call.error_type} above."
            return Sentence(text, line, "error")
        return Sentence(f"{head} failed{every} with {call.error_type}: {call.error}", line, "error")
    counts = sorted({c.released_buffers for c in calls})
    sizes = sorted({c.released_bytes for c in calls})
    each = "" if len(calls) == 1 else ", each"
    if counts == [0] and sizes == [0]:
        text = f"{head}{each} released no saved tensors"
    elif sizes == [0]:  # what they saved is held by parameters, variables, other tensors
        released = _tensors(call.released_buffers) if len(calls) == 1 else _span(counts, str)
        text = (
            f"{head}{each} released {released}{'' if len(calls) == 1 else ' saved tensors'}, "
            "freeing no memory: something besides the graph still holds theirs"
        )
    elif len(calls) == 1:
        text = (
            f"{head} released {_tensors(call.released_buffers)}, freeing "
            f"{format_bytes(call.released_bytes)} of retained memory"
        )
    elif len(counts) == 1 and len(sizes) == 1:
        text = (
            f"{head}, each released {_tensors(counts[0])}, freeing "
            f"{format_bytes(sizes[0])} of retained memory"
        )
    else:
        total = sum(c.released_bytes for c in calls)
        text = (
            f"{head}, each released {_span(counts, str)} saved tensors, freeing "
            f"{_span(sizes, format_bytes)} ({format_bytes(total)} in all)"
        )
    if call.retain_graph:
        text += "; the graph was kept for another backward"
    return Sentence(text + ".", line, "note")


def _tensors(count: int) -> str:
    return "1 saved tensor" if count == 1 else f"{count:,} saved tensors"


def _span(values: list[int], show: Callable[[int], str]) -> str:
    return show(values[0]) if len(values) == 1 else f"{show(values[0])} to {show(values[-1])}"


def _lines(lines: Iterable[int]) -> str:
    items = sorted(set(lines))
    return ("line " if len(items) == 1 else "lines ") + ", ".join(str(n) for n in items)


def _node_name(nodes: Mapping[int, NodeRecord], node_id: int | None) -> str:
    node = None if node_id is None else nodes.get(node_id)
    return "?" if node is None else f"{node.name}#{node.id}"


def _saved_by(nodes: Mapping[int, NodeRecord], node_id: int | None) -> str:
    """A readable label for a saved tensor no user variable names: `saved by addmm`, `saved by
    the LSTM/GRU layer (mkldnnrnnlayer)` for a fused op whose name says little."""
    node = None if node_id is None else nodes.get(node_id)
    if node is None:
        return "saved tensor"
    op = node.name.removesuffix("Backward0").removesuffix("Backward1").removesuffix("Backward")
    words = FUSED_OP_WORDS.get(node.name)
    if words is not None:
        return f"saved by {words} ({op.lower()})"
    return f"saved by {op.lower() or node.name}"


# Fused kernels' nodes, whose names say little to a user, by what they compute.
FUSED_OP_WORDS = {
    "MkldnnRnnLayerBackward0": "the LSTM/GRU layer",
    "CudnnRnnBackward0": "the LSTM/GRU layer",
    "MiopenRnnBackward0": "the LSTM/GRU layer",
    "ThnnFusedLstmCellBackward0": "the LSTM cell",
    "ThnnFusedGruCellBackward0": "the GRU cell",
    "NativeLayerNormBackward0": "layer norm",
    "NativeBatchNormBackward0": "batch norm",
    "CudnnBatchNormBackward0": "batch norm",
    "NativeGroupNormBackward0": "group norm",
    "ConvolutionBackward0": "the convolution",
    "ScaledDotProductFlashAttentionForCpuBackward0": "attention",
    "ScaledDotProductFlashAttentionBackward0": "attention",
    "ScaledDotProductEfficientAttentionBackward0": "attention",
    "ScaledDotProductCudnnAttentionBackward0": "attention",
    "EmbeddingBackward0": "the embedding",
    "EmbeddingDenseBackward0": "the embedding",
}


# The Buffers table's "kind": what a saved tensor is when graphs alone hold its memory, else
# why its bytes are not counted as retained.
_KINDS = {
    "": "activation",
    "parameter": "parameter",
    "module buffer": "module buffer",
    "user tensor": "your tensor",
    "live tensor": "shares a live tensor",
    "NumPy array": "shares a NumPy array",
    "elsewhere": "held outside Python",
}


def _buffer_kind(buffer: SavedBuffer) -> str:
    return _KINDS.get(buffer.held_by, buffer.held_by)


def buffer_table(trace: Trace, node_ids: set[int] | None = None) -> Table:
    """Saved tensors, still-held first then largest; restricted to `node_ids` when given.
    Tensors alike in all but their node (a loop's steps, repeated layers) share one row:
    'AddmmBackward0 (x1,000)'. A module column appears when the block ran modules."""
    with_module = any(b.module for b in trace.buffers)
    nodes = {n.id: n for n in trace.nodes}
    # Group on the raw fields first (formatting 100,000 rows is the slow part), then on the
    # rows as shown: different raw fields can read the same.
    raw: dict[tuple, list[SavedBuffer]] = {}
    for b in trace.buffers:
        if node_ids is None or b.node_id in node_ids:
            node = None if b.label or b.node_id is None else nodes.get(b.node_id)
            name = b.label or (node.name if node is not None else "")
            fields = (
                name,
                b.shape,
                b.dtype,
                b.device,
                b.nbytes,
                b.held_by,
                b.saved_site.line,
                b.freed_site,
                b.freed,
                b.module,
            )
            raw.setdefault(fields, []).append(b)
    groups: dict[tuple[str, ...], list[SavedBuffer]] = {}
    labels: dict[tuple[str, ...], set[str]] = {}
    for members in raw.values():  # `saved by add` for AddBackward0 and AddBackward1 alike
        row = _buffer_row(nodes, members[0], with_node=False)
        # Repeated layers' tensors (`layers.0.w`, `layers.1.w`) share a row too.
        key = (row[0], label_pattern(row[1]), *row[2:], label_pattern(members[0].module or ""))
        groups.setdefault(key, []).extend(members)
        labels.setdefault(key, set()).add(row[1])
    ordered = sorted(groups.items(), key=lambda kv: (kv[1][0].freed, -kv[1][0].nbytes, kv[1][0].id))
    rows = []
    for key, members in ordered[:MAX_TABLE_ROWS]:
        if len(members) == 1:
            row = _buffer_row(nodes, members[0], with_node=True)
        else:
            node = _node(nodes, members[0].node_id)
            name = "?" if node is None else node.name
            shown = labels[key]
            label = next(iter(shown)) if len(shown) == 1 else key[1]
            row = (f"{name} (x{len(members):,})", label, *key[2:5], f"{key[5]} each", *key[6:-1])
        if with_module:
            modules = {b.module for b in members}
            module = members[0].module or "" if len(modules) == 1 else key[-1]
            row = (row[0], module, *row[1:])
        rows.append(row)
    total = sum(len(m) for m in groups.values())
    note = ""
    if len(groups) > MAX_TABLE_ROWS:
        note = (
            f"Showing the first {MAX_TABLE_ROWS} of {len(groups):,} rows ({total:,} saved tensors)."
        )
    headers: tuple[str, ...] = ("node", "tensor", "shape", "dtype", "device", "bytes", "kind")
    headers = (*headers, "saved", "state")
    if with_module:
        headers = (headers[0], "module", *headers[1:])
    return Table("Saved tensors", headers, tuple(rows), note)


def _node(nodes: Mapping[int, NodeRecord], node_id: int | None) -> NodeRecord | None:
    return None if node_id is None else nodes.get(node_id)


def _buffer_row(
    nodes: Mapping[int, NodeRecord], b: SavedBuffer, with_node: bool
) -> tuple[str, ...]:
    node = _node_name(nodes, b.node_id) if with_node else ""
    return (
        node,
        b.label or _saved_by(nodes, b.node_id),
        "x".join(str(d) for d in b.shape) or "scalar",
        b.dtype,
        b.device,
        format_bytes(b.nbytes),
        _buffer_kind(b),
        f"line {b.saved_line}",
        f"released ({where(b.freed_site)})" if b.freed else "held",
    )


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
        "Sizes add tensor by tensor. 'Retained' counts each storage once, activations only: "
        "the other kinds are also held by something besides the graph."
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
    return Table("Storage groups", headers, tuple(rows[:MAX_TABLE_ROWS]), cut_note(len(rows)))


@dataclass(frozen=True)
class ReportTables:
    """The report's tables by name, built once per render of a trace (`report_tables`); every
    renderer picks them by name, so no renderer depends on another's order."""

    modules: Table
    buffer_totals: Table
    buffers: Table
    storage: Table
    versions: Table

    @property
    def versions_flag(self) -> int:
        """The versions table's column whose non-empty cells are flagged (its warnings)."""
        return self.versions.headers.index("warning")

    def flagged(self) -> list[tuple[Table, int | None]]:
        """The tables in page order, each with the column whose non-empty cells are flagged."""
        return [
            (self.modules, None),
            (self.buffer_totals, None),
            (self.buffers, None),
            (self.storage, None),
            (self.versions, self.versions_flag),
        ]


def report_tables(trace: Trace) -> ReportTables:
    """The report's tables: modules, saved-tensor totals and rows, storage, versions."""
    return ReportTables(
        modules=module_table(trace),
        buffer_totals=buffer_totals(trace),
        buffers=buffer_table(trace),
        storage=storage_table(trace),
        versions=versions_table(trace),
    )


def render_text(
    trace: Trace,
    tables: bool = True,
    named: ReportTables | None = None,
    view: GraphView | None = None,
) -> str:
    """The whole report as plain text: summary, sentences, backward calls (grouped by line) and,
    unless `tables` is False, the graph's boxes and every table, each cut to `TEXT_TABLE_ROWS`
    rows with a note. `named` and `view` pass tables and a default graph view a caller already
    built for the same trace (the panel's fallbacks)."""
    state = "error" if trace.error else ("finished" if trace.finished else "running")
    parts = [f"autograd_magic trace ({state})"]
    parts.append("\n".join(f"  {label}: {value}" for label, value in summary_items(trace)))
    found = sentences(trace)
    if found:
        parts.append("Findings:\n" + "\n".join(f"  - {s.text}" for s in found))
    calls = backward_sentences(trace)
    if calls:
        parts.append("Backward calls:\n" + "\n".join(f"  - {s.text}" for s in calls))
    if not tables:
        return "\n\n".join(parts) + "\n"
    named = named or report_tables(trace)
    shown = [named.modules]
    if trace.nodes:
        shown.append(graph_table(view or graph_view(trace)))
    shown += [named.buffer_totals, named.buffers, named.storage, named.versions]
    for table in shown:
        parts.append(table_text(capped(table, TEXT_TABLE_ROWS)))
    return "\n\n".join(parts) + "\n"
