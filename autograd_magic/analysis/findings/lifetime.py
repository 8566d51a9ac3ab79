"""Facts about graphs kept after their use: kept-alive (a variable or container holds them) and
unused-graph (graphs no backward used)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from autograd_magic.analysis.findings.facts import Fact
from autograd_magic.analysis.findings.source import store_site
from autograd_magic.analysis.index import RecordIndex, retained_bytes_of
from autograd_magic.model.records import NodeRecord
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import ACCUMULATE_GRAD, cell_line


def holder_group(path: str) -> str:
    """`losses[3]` -> `losses`: elements of one container are reported together."""
    return path.split("[", 1)[0] if "[" in path else path


def root_name(trace: Trace, root_ids: tuple[int, ...]) -> str | None:
    """The user's path for the first of `root_ids` that a variable holds."""
    names = {h.node_id: h.path for h in trace.holders}
    for node_id in root_ids:
        if node_id in names:
            return names[node_id]
    return None


# ----- kept-alive -------------------------------------------------------------------------
def kept_alive(trace: Trace, graph: RecordIndex) -> list[Fact]:
    """User variables, container elements or attributes keeping graphs alive past their use."""
    groups: dict[str, list[NodeRecord]] = {}
    for holder in trace.holders:
        node = graph.node(holder.node_id)
        if node is not None and node.alive and node.name != ACCUMULATE_GRAD:
            groups.setdefault(holder_group(holder.path), []).append(node)
    facts = []
    for path, roots in groups.items():
        fact = _kept_alive_chain(path, roots[0], graph) if len(roots) == 1 else None
        if fact is None and ("[" in path or "." in path or len(roots) > 1):
            fact = _kept_alive_container(path, roots, graph)
        if fact is not None:
            facts.append(fact)
    return facts


def _kept_alive_chain(path: str, root: NodeRecord, graph: RecordIndex) -> Fact | None:
    """A plain variable that adds each iteration's loss to itself (`total_loss += loss`)."""
    nodes = graph.live_reach([root.id])
    # Links made by an accumulator are never walked by a backward; a carried state's links are
    # (graph-growth and backward-through-freed report those).
    same_line = [
        n
        for n in map(graph.node, nodes)
        if n is not None
        and n.name != ACCUMULATE_GRAD
        and n.born_site == root.born_site
        and n.reached_by is None
    ]
    epochs = {graph.epoch(n.born_seq) for n in same_line}
    if len(same_line) < 2 or len(epochs) < 2:
        return None
    nbytes = retained_bytes_of(graph.buffers_of(nodes, live=True))
    return Fact(
        "kept-alive",
        "chain",
        cell_line(root.born_site),
        holder=path,
        nbytes=nbytes,
        built=root.born_site,
        iterations=len(epochs),
        node_ids=tuple(sorted(nodes)),
    )


def _kept_alive_container(path: str, roots: list[NodeRecord], graph: RecordIndex) -> Fact | None:
    """Container elements or object attributes holding graphs after a backward used them."""
    nodes = graph.live_reach(n.id for n in roots)
    if all((n := graph.node(i)) is not None and n.name == ACCUMULATE_GRAD for i in nodes):
        return None
    used = any((n := graph.node(i)) is not None and n.reached_by is not None for i in nodes) or any(
        graph.epoch(r.born_seq) < len(graph.backward_seqs) for r in roots
    )
    nbytes = retained_bytes_of(graph.buffers_of(nodes, live=True))
    epochs = {graph.epoch(r.born_seq) for r in roots}
    grows = len(epochs) > 1 or (not used and len(roots) > 1)
    # The last iteration's own result holding its own, already released graph is normal.
    if not grows and not (used and nbytes):
        return None
    first = min(roots, key=lambda n: n.born_seq)
    computed = cell_line(first.born_site)
    store = store_site(graph.trace, path, computed)
    line = computed if store is None else store.line
    return Fact(
        "kept-alive",
        "container",
        line,
        tuple(sorted({cell_line(r.born_site) for r in roots} - {line})),
        path,
        nbytes,
        reference=store,
        built=first.born_site,
        iterations=len(epochs),
        node_ids=tuple(sorted(nodes)),
        detail={"roots": len(roots)},
    )


# ----- unused-graph ----------------------------------------------------------------------
_ADD = "AddBackward0"


def unused_graph(trace: Trace, graph: RecordIndex) -> list[Fact]:
    """Graphs built with saved tensors that no backward ever used (e.g. inference with grad on)."""
    unused = {
        n.id: n
        for n in trace.nodes
        if n.reached_by is None and not n.existed_before and n.name != ACCUMULATE_GRAD
    }
    children = {c for n in unused.values() for c in n.next_ids}
    roots = [n for n in unused.values() if n.id not in children]
    by_line: dict[int, list[NodeRecord]] = {}
    for root in roots:
        by_line.setdefault(cell_line(root.born_site), []).append(root)
    no_backward = not trace.backward_calls
    fed_a_backward = {n.born_site for n in trace.nodes if n.reached_by is not None}
    facts = []
    for line, line_roots in by_line.items():
        freed = [r for r in line_roots if not r.alive]
        for root in line_roots:
            if root.alive and root.born_site in fed_a_backward:
                fact = _leftover(trace, graph, root, unused)
                facts += [fact] if fact else []
        if not (no_backward or freed):
            continue
        per_graph = [_unused_bytes(graph, r, unused) for r in line_roots]
        if not any(per_graph):
            continue
        facts.append(_unused(trace, line, line_roots, freed, max(per_graph)))
    return facts


def _leftover(
    trace: Trace, graph: RecordIndex, root: NodeRecord, unused: dict[int, NodeRecord]
) -> Fact | None:
    """A variable still holding results its line made after the last backward that used them
    (a partial batch left in `total_loss`): they never reach the gradients."""
    # Only a running sum (`total_loss += loss`, an add chain on one line) is a leftover.
    holder = root_name(trace, (root.id,)) if root.name == _ADD else None
    if holder is None:
        return None
    chain = [root]
    while previous := [
        n
        for n in map(graph.node, chain[-1].next_ids)
        if n is not None and n.id in unused and n.born_site == root.born_site and n.name == _ADD
    ]:
        chain.append(previous[0])
    if len(chain) < 2:
        return None
    part = graph.reach_within(root.id, unused)
    last = trace.backward_calls[-1]
    return Fact(
        "unused-graph",
        "leftover",
        cell_line(root.born_site),
        (cell_line(last.site),),
        holder,
        retained_bytes_of(graph.buffers_of(part, live=True)),
        reference=last.site,
        built=root.born_site,
        node_ids=tuple(sorted(part)),
        detail={"results": len(chain)},
    )


def _unused_bytes(graph: RecordIndex, root: NodeRecord, unused: dict[int, NodeRecord]) -> int:
    return retained_bytes_of(graph.buffers_of(graph.reach_within(root.id, unused), live=False))


def _unused(
    trace: Trace, line: int, roots: list[NodeRecord], freed: list[NodeRecord], peak: int
) -> Fact:
    ids = {r.id for r in roots}
    paths = [h.path for h in trace.holders if h.node_id in ids]
    # An attribute or a container (`crit.loss` set in a forward) is the holder a user would miss.
    holder = next((p for p in paths if "." in p or "[" in p), paths[0] if paths else None)
    detail: dict[str, Any] = {
        "graphs": len(roots),
        "held": bool(holder) and any(r.alive for r in roots),
    }
    if not trace.backward_calls:
        return Fact(
            "unused-graph",
            "no-backward",
            line,
            (),
            holder,
            peak,
            built=roots[0].born_site,
            node_ids=tuple(sorted(ids)),
            detail=detail,
        )
    freed_at = Counter(cell_line(r.freed_site) for r in freed if r.freed_site is not None)
    detail["freed_at"] = freed_at.most_common(1)[0][0] if freed_at else None
    return Fact(
        "unused-graph",
        "never-reached",
        line,
        tuple(sorted(set(freed_at) - {line})),
        holder,
        peak,
        built=roots[0].born_site,
        node_ids=tuple(sorted(ids)),
        detail=detail,
    )
