"""Layout of the graph view: boxes (grouped by `analysis.grouping`: by module, or by repeated
structure above `max_nodes`) in layers (longest path, leaves beside their user, two barycenter
sweeps; linear in nodes and edges), with a note saying what was merged. Pure data: figures draw
a `GraphView`, they do not lay it out.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from dataclasses import dataclass, field

from autograd_magic.analysis.grouping import OPS, Grouping, ModuleBox, group
from autograd_magic.model.records import NodeRecord
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import ACCUMULATE_GRAD

__all__ = ["DEFAULT_MAX_NODES", "OPS", "Box", "GraphView", "graph_view"]
DEFAULT_MAX_NODES = 200


@dataclass
class Box:
    """One drawn node: a single autograd node, several merged ones (`members`, node ids), or an
    nn.Module (`module` set: its path, `type` its class, `modules` how many merged)."""

    name: str
    where: str
    members: list[int] = field(default_factory=list)
    alive: int = 0
    leaf: bool = True
    saved_bytes: int = 0  # ever saved for backward by its nodes, released or not
    held_bytes: int = 0  # of those, not released yet
    layer: int = 0
    x: float = 0.0
    module: str = ""
    type: str = ""
    modules: int = 0
    params: int = 0  # leaves (parameters, inputs) folded into this box
    holders: list[str] = field(default_factory=list)  # user paths keeping a root here alive

    @property
    def label(self) -> str:
        """'MulBackward0 x100 (line 4)', or 'layers.0 TransformerEncoderLayer (75 nodes)'."""
        count = f" x{len(self.members)}" if len(self.members) > 1 else ""
        if self.module:
            repeat = f" x{self.modules}" if self.modules > 1 else ""
            return f"{self.name} {self.type}{repeat} ({len(self.members):,} nodes)"
        return f"{self.name}{count} ({self.where})"


@dataclass
class GraphView:
    """The graph as drawn: boxes, edges between box indices, what was collapsed, and the module
    depth shown (`OPS`: every op) out of `max_depth` (0: the trace has no module paths)."""

    boxes: list[Box]
    edges: list[tuple[int, int]]
    total_nodes: int
    note: str = ""
    depth: int = OPS
    max_depth: int = 0


def graph_view(
    trace: Trace, max_nodes: int = DEFAULT_MAX_NODES, depth: int | None = None
) -> GraphView:
    """Lay out the recorded graph in at most `max_nodes` boxes: one per module at `depth` when
    the trace has module paths (None: the deepest that stays readable; `OPS`: every op).
    Computed on each call: a renderer that shows it twice keeps the view it built."""
    return _graph_view(trace, max_nodes, depth)


def _graph_view(trace: Trace, max_nodes: int, depth: int | None) -> GraphView:
    records = trace.nodes
    recorded = {r.id for r in records}
    missing = set(itertools.chain.from_iterable(r.next_ids for r in records)) - recorded
    next_ids = {
        r.id: tuple(c for c in r.next_ids if c not in missing) if missing else r.next_ids
        for r in records
    }
    users: dict[int, list[int]] = {}
    for record in records:
        for child in next_ids[record.id]:
            users.setdefault(child, []).append(record.id)
    grouping = group(trace, records, next_ids, users, max(1, max_nodes), depth)
    index: dict[Hashable, int] = {}
    boxes: list[Box] = []
    box_of: dict[int, int] = {}
    key_of, modules = grouping.key, grouping.modules
    for record in records:  # the hot loop on 100,000 records: plain fields, no properties
        key = key_of(record)
        at = index.get(key)
        if at is None:
            at = index[key] = len(boxes)
            boxes.append(_new_box(record, key, modules.get(key)))
        box_of[record.id] = at
        box = boxes[at]
        box.members.append(record.id)
        if record.freed_seq is None:
            box.alive += 1
        if record.name == ACCUMULATE_GRAD:
            box.params += 1
        else:
            box.leaf = False
    saved, held = _saved(trace)
    for node, nbytes in saved.items():
        if node in box_of:
            boxes[box_of[node]].saved_bytes += nbytes
    for node, nbytes in held.items():
        if node in box_of:
            boxes[box_of[node]].held_bytes += nbytes
    for holder in trace.holders:
        if holder.node_id in box_of:
            boxes[box_of[holder.node_id]].holders.append(holder.path)
    edges = {
        (a, b) for u, vs in next_ids.items() for v in vs if (a := box_of[u]) != (b := box_of[v])
    }
    view = GraphView(
        boxes,
        sorted(edges),
        len(records),
        _note(grouping, len(records), len(boxes)),
        grouping.depth,
        grouping.max_depth,
    )
    _layer_boxes(view)
    _order_layers(view)
    return view


def _new_box(record: NodeRecord, key: Hashable, module: ModuleBox | None) -> Box:
    if module is not None:
        return Box(
            module.name, module.type, module=module.path, type=module.type, modules=module.modules
        )
    name = "other lines" if key == ("other",) else record.name
    return Box(name, record.born_site.describe())


def _saved(trace: Trace) -> tuple[dict[int, int], dict[int, int]]:
    """Bytes each node saved for backward over the block, and those not released yet: the
    tensors only graphs hold, as in the Modules view (parameters and kept inputs outlive it)."""
    saved: dict[int, int] = {}
    held: dict[int, int] = {}
    for buffer in trace.buffers:
        node = buffer.node_id
        if node is not None and buffer.retained:
            saved[node] = saved.get(node, 0) + buffer.nbytes
            if buffer.freed_seq is None:
                held[node] = held.get(node, 0) + buffer.nbytes
    return saved, held


def _note(grouping: Grouping, nodes: int, boxes: int) -> str:
    """What the view merged, in a sentence ('' when every node is its own box)."""
    if grouping.depth == OPS:
        merged = grouping.note
    else:
        merged = (
            f"one box per module at depth {grouping.depth} of {grouping.max_depth} (parameters "
            "inside the box that uses them)"
        )
        merged += f"; {grouping.note}" if grouping.note else ", and one box per op outside them"
    return f"{nodes:,} nodes shown as {boxes:,} boxes: {merged}." if merged else ""


def _layer_boxes(view: GraphView) -> None:
    """Longest path down to a sink on the box graph (the loss gets the largest layer), then each
    sink one layer above its first user, so leaves sit beside what uses them. Merged boxes can
    form cycles: edges closing one are ignored for layering (they are still drawn)."""
    n = len(view.boxes)
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    for a, b in view.edges:
        succ[a].append(b)
        pred[b].append(a)
    order = _dfs_order(succ, pred)
    rank = {box: i for i, box in enumerate(order)}
    layer = [0] * n
    for i in reversed(order):
        layer[i] = 1 + max((layer[c] for c in succ[i] if rank[c] > rank[i]), default=-1)
    for i in range(n):
        if not succ[i] and pred[i]:
            layer[i] = min(layer[p] for p in pred[i]) - 1
    for box, found in zip(view.boxes, layer, strict=True):
        box.layer = found


def _dfs_order(succ: list[list[int]], pred: list[list[int]]) -> list[int]:
    """A topological order of the graph without its back edges (reverse DFS post-order, started
    from the sources: the loss first)."""
    seen = [False] * len(succ)
    post: list[int] = []
    starts = [i for i, p in enumerate(pred) if not p] + list(range(len(succ)))
    for start in starts:
        if seen[start]:
            continue
        seen[start] = True
        stack = [(start, iter(succ[start]))]
        while stack:
            node, children = stack[-1]
            for child in children:
                if not seen[child]:
                    seen[child] = True
                    stack.append((child, iter(succ[child])))
                    break
            else:
                stack.pop()
                post.append(node)
    return post[::-1]


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
