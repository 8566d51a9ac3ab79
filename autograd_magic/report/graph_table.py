"""The graph view as a table: the text report's and the static copy's account of the picture
(same boxes, same order: top to bottom, left to right)."""

from __future__ import annotations

from autograd_magic.analysis.layout import OPS, GraphView
from autograd_magic.model.units import format_bytes
from autograd_magic.report.model import Table

GRAPH_ROWS = 20


def graph_table(view: GraphView, limit: int = GRAPH_ROWS) -> Table:
    """One row per drawn box with its nodes, bytes saved for backward over the block and bytes
    still held; the note says what was merged and how many boxes were left out."""
    order = sorted(range(len(view.boxes)), key=lambda i: (view.boxes[i].layer, view.boxes[i].x))
    rows = []
    for i in order[:limit]:
        box = view.boxes[i]
        kind = box.type + (f" x{box.modules}" if box.modules > 1 else "")
        rows.append(
            (
                box.name if box.module else box.label,
                kind if box.module else "op",
                f"{len(box.members):,}",
                format_bytes(box.saved_bytes),
                format_bytes(box.held_bytes),
            )
        )
    depth = f"module depth {view.depth} of {view.max_depth}" if view.depth != OPS else "every op"
    note = view.note or f"All {view.total_nodes:,} recorded nodes are shown."
    if len(order) > limit:
        note += f" Showing the first {limit} of {len(order):,} boxes."
    headers = ("box", "type", "nodes", "saved (ever)", "held now")
    return Table(f"Graph ({depth})", headers if rows else (), tuple(rows), note)
