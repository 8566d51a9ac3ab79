"""Facts about graphs kept after their use: kept-alive (a variable or container holds them) and
unused-graph (graphs no backward used)."""

from __future__ import annotations

import bisect
from array import array
from collections import Counter
from collections.abc import Iterator

from autograd_magic.analysis.findings.facts import (
    KeptChain,
    KeptContainer,
    Leftover,
    NeverReached,
    NoBackward,
    UnusedGraphs,
)
from autograd_magic.analysis.findings.source import (
    attribute_store_site,
    store_site,
    without_graph,
)
from autograd_magic.analysis.index import RecordIndex, retained_bytes_of
from autograd_magic.model.records import NodeRecord
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import ACCUMULATE_GRAD, cell_line


def holder_group(path: str) -> str:
    """`losses[3]` -> `losses`: elements of one container are reported together."""
    return path.split("[", 1)[0] if "[" in path else path


def stored_holder(paths: list[str]) -> str | None:
    """The first path that is a container element or an attribute (`losses[2]`, `crit.loss`):
    the holder a user would miss, unlike a plain variable holding the latest result."""
    return next((p for p in paths if "." in p or "[" in p), None)


def root_name(trace: Trace, root_ids: tuple[int, ...]) -> str | None:
    """The user's path for the first of `root_ids` that a variable holds."""
    names = {h.node_id: h.path for h in trace.holders}
    for node_id in root_ids:
        if node_id in names:
            return names[node_id]
    return None


# ----- kept-alive -------------------------------------------------------------------------
def kept_alive(trace: Trace, graph: RecordIndex) -> list[KeptChain | KeptContainer]:
    """User variables, container elements or attributes keeping graphs alive past their use."""
    groups: dict[str, list[NodeRecord]] = {}
    for holder in trace.holders:
        node = graph.node(holder.node_id)
        if node is not None and node.alive and node.name != ACCUMULATE_GRAD:
            groups.setdefault(holder_group(holder.path), []).append(node)
    facts: list[KeptChain | KeptContainer] = []
    for path, roots in groups.items():
        fact: KeptChain | KeptContainer | None = (
            _kept_alive_chain(path, roots[0], graph) if len(roots) == 1 else None
        )
        if fact is None and ("[" in path or "." in path or len(roots) > 1):
            fact = _kept_alive_container(path, roots, graph)
        if fact is not None:
            facts.append(fact)
    return facts


def _kept_alive_chain(path: str, root: NodeRecord, graph: RecordIndex) -> KeptChain | None:
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
    built = root.born_site
    # Filled inside a function (a module's forward): the line to fix is the inner one.
    inner = built.outer_line is not None and built.outer_line != built.line
    return KeptChain(
        line=built.line if inner else cell_line(built),
        related_lines=(cell_line(built),) if inner else (),
        holder=path,
        nbytes=nbytes,
        built=root.born_site,
        iterations=len(epochs),
        node_ids=tuple(sorted(nodes)),
        fix=without_graph(built, path),
    )


def _kept_alive_container(
    path: str, roots: list[NodeRecord], graph: RecordIndex
) -> KeptContainer | None:
    """Container elements or object attributes holding graphs after a backward used them."""
    nodes = graph.live_reach(n.id for n in roots)
    if all((n := graph.node(i)) is not None and n.name == ACCUMULATE_GRAD for i in nodes):
        return None
    walked = [n for n in map(graph.node, nodes) if n is not None and n.reached_by is not None]
    # The parameters' accumulators are walked by training whatever the outputs were for: only
    # a walk through the outputs' own nodes says a backward used them.
    used = any(n.name != ACCUMULATE_GRAD for n in walked)
    # Kept past a backward (that walked part of it, or ran after it was built).
    outlived = bool(walked) or any(
        graph.epoch(r.born_seq) < len(graph.backward_seqs) for r in roots
    )
    nbytes = retained_bytes_of(graph.buffers_of(nodes, live=True))
    epochs = {graph.epoch(r.born_seq) for r in roots}
    grows = len(epochs) > 1 or (not outlived and len(roots) > 1)
    # The last iteration's own result holding its own, already released graph is normal.
    if not grows and not (outlived and nbytes):
        return None
    first = min(roots, key=lambda n: n.born_seq)
    computed = cell_line(first.born_site)
    store = store_site(graph.trace, path, computed) or attribute_store_site(
        graph.trace, path, computed
    )
    line = computed if store is None else store.line
    related = {cell_line(r.born_site) for r in roots}
    if store is not None and store.outer_line is not None:
        related.add(store.outer_line)  # the call that reached the filling method
    return KeptContainer(
        line=line,
        related_lines=tuple(sorted(related - {line})),
        holder=path,
        nbytes=nbytes,
        reference=store,
        built=first.born_site,
        iterations=len(epochs),
        node_ids=tuple(sorted(nodes)),
        roots=len(roots),
        used=used,
    )


# ----- unused-graph ----------------------------------------------------------------------
_ADD = "AddBackward0"


def unused_graph(trace: Trace, graph: RecordIndex) -> list[Leftover | UnusedGraphs]:
    """Graphs built with saved tensors that no backward used, when they cost something a user
    would want back: a forward whose graph outlived the moment it was made (inference with grad
    on, a per-sample forward skipped), named at the line that built it. A metric computed from a
    trained graph (`loss.exp().item()`, a distribution's normalised `probs`) and a graph dropped
    at once (`G(z).detach()`) are what correct loops do."""
    unused = {
        n.id: n
        for n in trace.nodes
        if n.reached_by is None and not n.existed_before and n.name != ACCUMULATE_GRAD
    }
    children = {c for n in unused.values() for c in n.next_ids}
    roots = [n for n in unused.values() if n.id not in children]
    del children  # at the record cap each of these sets and dicts is a few MB: one at a time
    fed_a_backward = {n.born_site for n in trace.nodes if n.reached_by is not None}
    facts: list[Leftover | UnusedGraphs] = []
    for root in roots:
        if root.alive and root.born_site in fed_a_backward:
            fact = _leftover(trace, graph, root, unused)
            facts += [fact] if fact else []
    told = {i for f in facts for i in f.node_ids}  # a leftover's graphs are said once
    if told:
        unused = {i: n for i, n in unused.items() if i not in told}
    births = sorted(n.born_seq for n in trace.nodes)
    by_line: dict[int, list[set[int]]] = {}
    for part in _components(unused):
        if _byproduct(graph, part) or _transient(graph, part, births):
            continue
        by_line.setdefault(_building_line(graph, part), []).append(part)
    for line, parts in by_line.items():
        per_graph = [retained_bytes_of(graph.buffers_of(p, live=False)) for p in parts]
        if any(per_graph):
            facts.append(_unused(trace, graph, line, parts, max(per_graph)))
    return facts


def _components(unused: dict[int, NodeRecord]) -> Iterator[set[int]]:
    """The unused nodes split into graphs (nodes joined by an edge belong to one graph), in
    the order of their smallest node id, one set at a time: a loop of forwards it never
    trained makes tens of thousands of them, and all at once they cost ~10 MB at the cap."""
    parent: dict[int, int] = {}  # only nodes joined under another; a root is its own

    def find(i: int) -> int:
        root = i
        while (up := parent.get(root, root)) != root:
            root = up
        while i != root:  # path compression
            up = parent[i]
            parent[i] = root
            i = up
        return root

    for node in unused.values():
        for child in node.next_ids:
            if child in unused:
                below, above = find(child), find(node.id)
                if below != above:
                    parent[below] = above
    ids = array("q", sorted(unused))
    roots = array("q", map(find, ids))
    parent.clear()
    rank: dict[int, int] = {}  # a graph's root -> its place, in the order of smallest ids
    for root in roots:
        rank.setdefault(root, len(rank))
    # Counting sort of the ids by graph: `members[starts[k]:starts[k + 1]]` is graph k.
    starts = array("q", bytes(8 * (len(rank) + 1)))
    for root in roots:
        starts[rank[root] + 1] += 1
    for k in range(len(rank)):
        starts[k + 1] += starts[k]
    fill, members = array("q", starts), array("q", bytes(8 * len(ids)))
    for node_id, root in zip(ids, roots, strict=True):
        k = rank[root]
        members[fill[k]] = node_id
        fill[k] += 1
    del ids, roots, rank, fill
    for k in range(len(starts) - 1):
        yield set(members[starts[k] : starts[k + 1]])


def _byproduct(graph: RecordIndex, part: set[int]) -> bool:
    """Whether the graph hangs off a graph a backward used: a metric or a sample computed from
    a trained output, not a forward of its own."""
    return any(
        (child := graph.node(c)) is not None
        and child.name != ACCUMULATE_GRAD
        and child.reached_by is not None
        for i in part
        for c in graph.nodes[i].next_ids
    )


def _transient(graph: RecordIndex, part: set[int], births: list[int]) -> bool:
    """Whether every node of the graph died before any other node was made: built and dropped
    in one expression (`G(z).detach()`), so it never held memory past that moment."""
    nodes = [graph.nodes[i] for i in part]
    if any(n.alive for n in nodes):
        return False
    last_born = max(n.born_seq for n in nodes)
    last_freed = max(n.freed_seq or 0 for n in nodes)
    between = bisect.bisect_left(births, last_freed) - bisect.bisect_right(births, last_born)
    return between == 0


def _building_line(graph: RecordIndex, part: set[int]) -> int:
    """The line that built most of the graph's saved bytes (the forward, not the line that
    consumed its output), or that made most of its nodes when nothing was saved."""
    weight: Counter[int] = Counter()
    for buffer in graph.buffers_of(part, live=False):
        if not buffer.is_leaf:
            weight[cell_line(buffer.saved_site)] += buffer.nbytes
    if not weight:
        weight.update(cell_line(graph.nodes[i].born_site) for i in part)
    return weight.most_common(1)[0][0]


def _leftover(
    trace: Trace, graph: RecordIndex, root: NodeRecord, unused: dict[int, NodeRecord]
) -> Leftover | None:
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
    return Leftover(
        line=cell_line(root.born_site),
        related_lines=(cell_line(last.site),),
        holder=holder,
        nbytes=retained_bytes_of(graph.buffers_of(part, live=True)),
        reference=last.site,
        built=root.born_site,
        node_ids=tuple(sorted(part)),
        results=len(chain),
    )


def _which_graphs(
    trace: Trace, graph: RecordIndex, parts: list[set[int]]
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Each holder's graphs among `parts`, by position in building order (0: the first built)."""
    first_seq = [min(graph.nodes[i].born_seq for i in part if i in graph.nodes) for part in parts]
    position = {}
    for rank, k in enumerate(sorted(range(len(parts)), key=first_seq.__getitem__)):
        position.update(dict.fromkeys(parts[k], rank))
    holds: dict[str, list[int]] = {}
    for h in trace.holders:
        if h.node_id in position:
            ranks = holds.setdefault(holder_group(h.path), [])
            if position[h.node_id] not in ranks:
                ranks.append(position[h.node_id])
    return tuple((path, tuple(sorted(ranks))) for path, ranks in holds.items())


def _unused(
    trace: Trace, graph: RecordIndex, line: int, parts: list[set[int]], peak: int
) -> UnusedGraphs:
    ids = set().union(*parts)
    nodes = [graph.nodes[i] for i in sorted(ids)]
    at_line = [n for n in nodes if cell_line(n.born_site) == line]
    built = min(at_line or nodes, key=lambda n: n.born_seq).born_site
    held = [h.path for h in trace.holders if h.node_id in ids]
    own = [h.path for h in trace.holders if h.node_id in {n.id for n in at_line}]
    # An attribute or a container (`crit.loss` set in a forward) is the holder a user would miss.
    candidates = own or held
    path = stored_holder(held) or (candidates[0] if candidates else None)
    holder = None if path is None else holder_group(path)
    graphs = len(parts)
    still_held = bool(holder) and any(graph.nodes[i].alive for i in ids if i in graph.nodes)
    holds = _which_graphs(trace, graph, parts)
    if not trace.backward_calls:
        return NoBackward(
            line=line,
            holder=holder,
            nbytes=peak,
            built=built,
            node_ids=tuple(sorted(ids)),
            graphs=graphs,
            held=still_held,
            holds=holds,
        )
    roots = [n for n in nodes if n.freed_site is not None and not n.alive]
    freed_at = Counter(cell_line(n.freed_site) for n in roots if n.freed_site is not None)
    return NeverReached(
        line=line,
        related_lines=tuple(sorted(set(freed_at) - {line})),
        holder=holder,
        nbytes=peak,
        built=built,
        node_ids=tuple(sorted(ids)),
        graphs=graphs,
        held=still_held,
        holds=holds,
        freed_at=freed_at.most_common(1)[0][0] if freed_at else None,
    )
