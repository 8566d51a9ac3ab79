"""The saved-tensor tables (each saved tensor, totals by state and kind) and the storage
groups table."""

from __future__ import annotations

from collections.abc import Mapping

from autograd_magic.analysis.findings.source import traced_path
from autograd_magic.analysis.result import Analysis
from autograd_magic.model.records import NodeRecord, SavedBuffer
from autograd_magic.model.units import format_bytes, where
from autograd_magic.report.model import MAX_TABLE_ROWS, Table, cut_note
from autograd_magic.report.quotes import place_of
from autograd_magic.report.versions import label_pattern


def _node_name(nodes: Mapping[int, NodeRecord], node_id: int | None) -> str:
    node = None if node_id is None else nodes.get(node_id)
    return "?" if node is None else f"{node.name}#{node.id}"


def _saved_by(nodes: Mapping[int, NodeRecord], node_id: int | None) -> str:
    """A readable label for a saved tensor no user variable names: `saved by addmm`, `saved by
    the LSTM/GRU layer (mkldnnrnnlayer)` or `saved by layer norm` for a fused op whose name says
    little."""
    node = None if node_id is None else nodes.get(node_id)
    if node is None:
        return "saved tensor"
    op = node.name.removesuffix("Backward0").removesuffix("Backward1").removesuffix("Backward")
    words = FUSED_OP_WORDS.get(node.name)
    if words is not None:
        # The kernel's name only where the words do not already say it: 'saved by layer norm',
        # not '... (nativelayernorm)'; 'saved by the LSTM/GRU layer (mkldnnrnnlayer)'.
        said = words.removeprefix("the ").replace(" ", "")
        return f"saved by {words}" + ("" if said in op.lower() else f" ({op.lower()})")
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


def buffer_table(analysis: Analysis, node_ids: set[int] | None = None) -> Table:
    """Saved tensors, still-held first then largest; restricted to `node_ids` when given.
    Tensors alike in all but their node (a loop's steps, repeated layers) share one row:
    'AddmmBackward0 (x1,000)'. A module column appears when the block ran modules."""
    trace = analysis.trace
    with_module = any(b.module for b in trace.buffers)
    nodes = analysis.nodes_by_id
    file = traced_path(trace)
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
                b.saved_site.file,
                b.freed_site,
                b.freed,
                b.module,
            )
            raw.setdefault(fields, []).append(b)
    groups: dict[tuple[str, ...], list[SavedBuffer]] = {}
    labels: dict[tuple[str, ...], set[str]] = {}
    for members in raw.values():  # `saved by add` for AddBackward0 and AddBackward1 alike
        row = _buffer_row(nodes, members[0], file, with_node=False)
        # Repeated layers' tensors (`layers.0.w`, `layers.1.w`) share a row too.
        key = (row[0], label_pattern(row[1]), *row[2:], label_pattern(members[0].module or ""))
        groups.setdefault(key, []).extend(members)
        labels.setdefault(key, set()).add(row[1])
    ordered = sorted(groups.items(), key=lambda kv: (kv[1][0].freed, -kv[1][0].nbytes, kv[1][0].id))
    rows = []
    for key, members in ordered[:MAX_TABLE_ROWS]:
        if len(members) == 1:
            row = _buffer_row(nodes, members[0], file, with_node=True)
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
    nodes: Mapping[int, NodeRecord], b: SavedBuffer, file: str | None, with_node: bool
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
        _saved_where(b, file),
        f"released ({where(b.freed_site)})" if b.freed else "held",
    )


def _saved_where(b: SavedBuffer, file: str | None) -> str:
    """'line 9', or 'line 9 of cell In [3]' for a line of a function written outside the
    traced code's file `file` (a class defined in an earlier cell)."""
    site = b.saved_site
    if file is None or site.file == file or site.line == 0:
        return f"line {b.saved_line}"
    return f"line {b.saved_line} of {place_of(site.file)}"


def buffer_totals(analysis: Analysis) -> Table:
    """Counts and bytes of saved tensors by state (held / released) and kind."""
    totals: dict[tuple[str, str], list[int]] = {}
    for b in analysis.trace.buffers:
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


def storage_table(analysis: Analysis) -> Table:
    """One row per member of each shared-memory group, then its copies (separate memory)."""
    rows: list[tuple[str, ...]] = []
    for number, group in enumerate(analysis.storage_groups, start=1):
        for member in group.members:
            rows.append((f"group {number}", member, group.how.get(member, ""), "shares memory"))
        for copy, source in group.copies.items():
            rows.append((f"group {number}", copy, f"copy of {source}", "own memory (copy)"))
    headers = ("group", "tensor / array", "how it joined", "memory")
    return Table("Storage groups", headers, tuple(rows[:MAX_TABLE_ROWS]), cut_note(len(rows)))
