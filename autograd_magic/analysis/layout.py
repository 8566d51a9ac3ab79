"""Layout of the graph view: layered boxes (longest-path layers plus two barycenter sweeps,
linear in nodes and edges), collapsed into boxes of repeated structure above `max_nodes` with a
note saying what was merged. Pure data: figures draw a `GraphView`, they do not lay it out.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autograd_magic.model.records import NodeRecord
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import ACCUMULATE_GRAD

if TYPE_CHECKING:
    import networkx

DEFAULT_MAX_NODES = 200
STRUCTURE_DEPTH = 3


@dataclass
class Box:
    """One drawn node: a single autograd node, or several merged ones (`members`, node ids)."""

    name: str
    where: str
    members: list[int] = field(default_factory=list)
    alive: int = 0
    leaf: bool = True
    saved_bytes: int = 0
    layer: int = 0
    x: float = 0.0

    @property
    def label(self) -> str:
        """'MulBackward0 (line 4)' or 'MulBackward0 x100 (line 4)'."""
        count = f" x{len(self.members)}" if len(self.members) > 1 else ""
        return f"{self.name}{count} ({self.where})"


@dataclass
class GraphView:
    """The graph as drawn: boxes, edges between box indices, and what was collapsed."""

    boxes: list[Box]
    edges: list[tuple[int, int]]
    total_nodes: int
    note: str = ""


def graph_view(trace: Trace, max_nodes: int = DEFAULT_MAX_NODES) -> GraphView:
    """Lay out `trace.graph()`; above `max_nodes` merge nodes, coarsest grouping last."""
    graph = trace.graph()
    layers = _layers(graph)
    records = [n for n in trace.nodes if n.id in graph]
    next_ids = {n: list(graph.succ[n]) for n in graph.nodes}
    key_of, note = _collapse(records, next_ids, max(1, max_nodes))
    index: dict[Hashable, int] = {}
    boxes: list[Box] = []
    member_layers: list[list[int]] = []
    for record in records:
        key = key_of(record)
        at = index.get(key)
        if at is None:
            at = index[key] = len(boxes)
            name = record.name if key[0] != "other" else "other lines"
            boxes.append(Box(name, record.born_site.describe()))
            member_layers.append([])
        box = boxes[at]
        box.members.append(record.id)
        box.alive += record.alive
        box.leaf = box.leaf and record.name == ACCUMULATE_GRAD
        box.saved_bytes += graph.nodes[record.id]["saved_bytes"]
        member_layers[at].append(layers[record.id])
    box_of = {m: i for i, box in enumerate(boxes) for m in box.members}
    for box, found in zip(boxes, member_layers, strict=True):
        box.layer = sorted(found)[len(found) // 2]
    edges = {(box_of[u], box_of[v]) for u, v in graph.edges if box_of[u] != box_of[v]}
    view = GraphView(boxes, sorted(edges), len(records), note)
    _order_layers(view)
    return view


def _layers(graph: networkx.DiGraph) -> dict[int, int]:
    """Longest path down to a sink: leaves (inputs) get 0, the loss gets the largest layer."""
    import networkx  # loaded when a graph is first laid out, not with the extension

    try:
        order = list(networkx.topological_sort(graph))
    except networkx.NetworkXUnfeasible:  # autograd graphs are acyclic; stay drawable anyway
        order = list(graph.nodes)
    layer: dict[int, int] = {}
    succ = graph.succ
    for node in reversed(order):
        layer[node] = 1 + max((layer.get(c, 0) for c in succ[node]), default=-1)
    return layer


def _collapse(
    records: list[NodeRecord], next_ids: dict[int, list[int]], max_nodes: int
) -> tuple[Callable[[NodeRecord], tuple], str]:
    """The finest grouping that fits in `max_nodes` boxes, and a note saying what it merged."""
    n = len(records)
    if n <= max_nodes:
        return (lambda r: ("node", r.id)), ""
    shape = _structure(records, next_ids)
    levels: list[tuple[str, Callable[[NodeRecord], tuple]]] = [
        (
            "repeated structure is merged: one box per node type, creating line and "
            f"{STRUCTURE_DEPTH} levels of graph beneath it",
            lambda r: ("shape", r.born_site, shape[r.id]),
        ),
        (
            "nodes of the same type created on the same line are merged into one box",
            lambda r: ("line-type", r.born_site, r.name),
        ),
        ("all nodes created on one line are merged into one box", lambda r: ("line", r.born_site)),
    ]
    for text, key in levels:
        count = len({key(r) for r in records})
        if count <= max_nodes:
            return key, f"{n:,} nodes shown as {count:,} boxes: {text} (xN = nodes merged)."
    sizes: dict[tuple, int] = {}
    for record in records:
        sizes[("line", record.born_site)] = sizes.get(("line", record.born_site), 0) + 1
    kept = set(sorted(sizes, key=sizes.__getitem__, reverse=True)[: max_nodes - 1])
    other = len(sizes) - len(kept)

    def by_line(r: NodeRecord) -> tuple:
        key = ("line", r.born_site)
        return key if key in kept else ("other",)

    note = (
        f"{n:,} nodes shown as {len(kept) + 1:,} boxes: nodes are merged by the line that "
        f"created them, and the {other:,} lines with the fewest nodes share the 'other lines' box."
    )
    return by_line, note


def _structure(records: list[NodeRecord], next_ids: dict[int, list[int]]) -> dict[int, int]:
    """A hash of each node's type, line and the graph `STRUCTURE_DEPTH` levels beneath it."""
    base = {r.id: hash((r.name, r.born_site)) for r in records}
    current = base
    for _ in range(STRUCTURE_DEPTH):
        current = {
            node: hash((own, tuple(sorted(current[c] for c in next_ids[node]))))
            for node, own in base.items()
        }
    return current


def _order_layers(view: GraphView) -> None:
    """Place boxes left to right in their layer: one sweep down, one sweep up (barycenters)."""
    up: dict[int, list[int]] = {i: [] for i in range(len(view.boxes))}
    down: dict[int, list[int]] = {i: [] for i in range(len(view.boxes))}
    for a, b in view.edges:
        up[a].append(b)
        down[b].append(a)
    layers: dict[int, list[int]] = {}
    for i, box in enumerate(view.boxes):
        layers.setdefault(box.layer, []).append(i)
    boxes = view.boxes
    for neighbours, order in ((up, sorted(layers)), (down, sorted(layers, reverse=True))):
        for number in order:
            row = layers[number]

            def centre(i: int, row: list[int] = row, near: dict = neighbours) -> float:
                xs = [boxes[j].x for j in near[i] if boxes[j].layer != boxes[i].layer]
                return sum(xs) / len(xs) if xs else boxes[i].x

            row.sort(key=centre)
            start = -(len(row) - 1) / 2
            for rank, i in enumerate(row):
                boxes[i].x = start + rank
