"""Facts about graphs that reach across iterations or backward calls: graph-growth (the root
cause) and backward-through-freed (`retained.py` has retained-graph)."""

from __future__ import annotations

from collections import Counter
from typing import TypedDict

from autograd_magic.analysis.findings.facts import (
    FreedBuiltOnce,
    FreedByGrad,
    FreedByTwoLosses,
    FreedCarried,
    FreedKeptContainer,
    FreedTwice,
    FreedUnshared,
    GraphGrowth,
    Growth,
)
from autograd_magic.analysis.findings.lifetime import holder_group, root_name
from autograd_magic.analysis.findings.source import (
    backward_receiver,
    reads_itself,
)
from autograd_magic.analysis.index import RecordIndex
from autograd_magic.model.records import BackwardCall, NodeRecord, Site
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import ACCUMULATE_GRAD, cell_line

FREED_TWICE = "backward through the graph a second time"  # PyTorch's error for it


# ----- graph-growth -----------------------------------------------------------------------
def graph_growth(trace: Trace, graph: RecordIndex) -> GraphGrowth | None:
    """A value carried across iterations links each new graph to the one an earlier backward
    walked: the root cause of a growing graph, of retain_graph=True and of the optimizer error."""
    calls = [c for c in trace.backward_calls if c.earlier_nodes > 0 and not _freed_twice(c)]
    if not calls:
        return None
    carried, epochs = _carried_sites(trace, graph)
    if not carried:
        return None
    site = carried.most_common(1)[0][0]
    line = cell_line(site)
    holder = _carried_holder(trace, graph, site)
    ok = [c for c in calls if c.error is None]
    grew = len(ok) > 1 and ok[-1].graph_nodes > ok[0].graph_nodes
    return GraphGrowth(
        line=line,
        related_lines=tuple(sorted({cell_line(c.site) for c in calls} - {line})),
        holder=holder,
        nbytes=trace.peak_retained_bytes,
        reference=calls[-1].site,
        built=site,
        iterations=len(epochs[site]),
        earlier_nodes=calls[-1].earlier_nodes,
        grew=Growth(ok[0].graph_nodes, ok[-1].graph_nodes, len(ok) + 1) if grew else None,
        is_tuple=holder is not None and is_tuple(trace, holder),
        # create_graph=True retains on purpose: only an explicit retain_graph=True is a workaround.
        retain_graph_used=any(c.retain_graph and not c.create_graph for c in trace.backward_calls),
        # Writes autograd's check sees (an optimizer's): `.data` writes never break a backward,
        # they are their own finding, which says that detaching fixes them too.
        writes_hit_saved=any(b.hit_buffers and not b.bypass for b in trace.version_bumps),
        fast_weights=from_gradients(trace, site),
    )


def from_gradients(trace: Trace, site: Site) -> bool:
    """Whether the value made at `site` is computed from gradients that a
    `torch.autograd.grad(create_graph=True)` made (MAML's `w - lr * g`): its nodes' inputs
    include nodes born during such a call, at that call's line."""
    grad_sites = {c.site for c in trace.backward_calls if c.kind == "grad" and c.create_graph}
    if not grad_sites:
        return False
    by_id = {n.id: n for n in trace.nodes}
    return any(
        (child := by_id.get(c)) is not None and child.born_site in grad_sites
        for n in trace.nodes
        if n.born_site == site
        for c in n.next_ids
    )


def is_tuple(trace: Trace, holder: str) -> bool:
    """Whether `holder` is a tuple of tensors (an LSTM's `(h, c)`): it is detached per item."""
    return any(h.path.startswith(f"{holder}[") for h in trace.holders)


def _freed_twice(call: BackwardCall) -> bool:
    return call.error is not None and FREED_TWICE in call.error


def _carried_sites(trace: Trace, graph: RecordIndex) -> tuple[Counter[Site], dict[Site, set[int]]]:
    """Sites of values that an earlier backward walked and a later iteration consumed again,
    and the iterations each site built nodes in."""
    carried: Counter[Site] = Counter()
    first_walk: dict[int, int] = {}
    site_epochs: dict[Site, set[int]] = {}
    for node in trace.nodes:
        site_epochs.setdefault(node.born_site, set()).add(graph.epoch(node.born_seq))
    for node in trace.nodes:
        epoch = graph.epoch(node.born_seq)
        if node.reached_by is None:  # an accumulator (`total += loss`) no backward walks
            continue
        for child_id in node.next_ids:
            child = graph.node(child_id)
            if (
                child is not None
                and child.name != ACCUMULATE_GRAD
                and not child.existed_before
                and graph.epoch(child.born_seq) < epoch
                # A value fed forward before any backward walked its graph (a GAN's `fake`) is
                # one iteration's graph, not a carried one.
                and _first_walk(graph, child.id, first_walk) < epoch
                # The line that made it ran again in this iteration (`h = rnn(x, h)`): not one
                # forward feeding two backwards one after the other.
                and epoch in site_epochs[child.born_site]
            ):
                carried[child.born_site] += 1
    return carried, site_epochs


def _first_walk(graph: RecordIndex, root_id: int, memo: dict[int, int]) -> int:
    """The first backward that walked any node under `root_id` (a large number if none did)."""
    never = len(graph.backward_seqs) + 1
    stack = [root_id]
    while stack:
        node_id = stack[-1]
        node = graph.node(node_id)
        if node_id in memo or node is None or node.name == ACCUMULATE_GRAD:
            memo.setdefault(node_id, never)
            stack.pop()
            continue
        todo = [c for c in node.next_ids if c not in memo]
        if todo:
            stack.extend(todo)
            continue
        # A walk by torch.autograd.grad(create_graph=True) (MAML's inner step, a gradient
        # penalty) builds on the graph on purpose; the backward that follows uses it again.
        own = (
            never
            if node.reached_by is None or graph.trace.backward_calls[node.reached_by].create_graph
            else node.reached_by
        )
        memo[node_id] = min([own, *(memo[c] for c in node.next_ids)])
        stack.pop()
    return memo[root_id]


def _carried_holder(trace: Trace, graph: RecordIndex, site: Site) -> str | None:
    """The variable computed at `site` that its own line also reads (`h = rnn(x, h)`)."""
    names = []
    for holder in trace.holders:
        node = graph.node(holder.node_id)
        if node is not None and node.born_site == site:
            names.append(holder_group(holder.path))
    for name in names:
        if reads_itself(name, site):
            return name
    return names[0] if names else None


# ----- backward-through-freed -------------------------------------------------------------
def backward_through_freed(trace: Trace, graph: RecordIndex) -> list[FreedTwice]:
    """A backward that needed buffers an earlier backward had already released."""
    facts = []
    for index, call in enumerate(trace.backward_calls):
        if call.error is None or FREED_TWICE not in call.error:
            continue
        shared = _walked_before(graph, call, index)
        releaser = _releaser(trace, shared, index)
        facts.append(_freed_twice_fact(trace, graph, call, shared, releaser))
    return facts


def _walked_before(graph: RecordIndex, call: BackwardCall, index: int) -> list[NodeRecord]:
    """Nodes the failing call needed that an earlier backward had walked: the shared part."""
    nodes = (graph.node(i) for i in call.reached)
    return sorted(
        (
            n
            for n in nodes
            if n is not None
            and n.name != ACCUMULATE_GRAD
            and n.reached_by is not None
            and n.reached_by < index
        ),
        key=lambda n: n.born_seq,
    )


def _releaser(trace: Trace, shared: list[NodeRecord], index: int) -> BackwardCall | None:
    """The first earlier backward without retain_graph that could have freed the shared part."""
    first = min((n.reached_by for n in shared if n.reached_by is not None), default=0)
    for call in trace.backward_calls[first:index]:
        if not call.retain_graph and call.error is None:
            return call
    return None


class _FreedFields(TypedDict):
    """The fields every backward-through-freed fact has, whichever fix fits."""

    line: int | None
    related_lines: tuple[int, ...]
    holder: str | None
    reference: Site
    node_ids: tuple[int, ...]
    buffer_ids: tuple[int, ...]
    saved_lines: tuple[int, ...]
    built_lines: tuple[int, ...]
    releaser: Site | None


def _freed_twice_fact(
    trace: Trace,
    graph: RecordIndex,
    call: BackwardCall,
    shared: list[NodeRecord],
    releaser: BackwardCall | None,
) -> FreedTwice:
    # A loss local to a function (`finish_episode`) has no holder at the end: its line names it.
    name = root_name(trace, call.root_ids) or backward_receiver(call.site)
    built_lines = tuple(sorted({cell_line(n.born_site) for n in shared}))
    freed = [
        b
        for b in graph.buffers_of((n.id for n in shared), live=False)
        if b.freed and (b.freed_seq or 0) < call.seq
    ]
    saved_lines = tuple(sorted({cell_line(b.saved_site) for b in freed})) or built_lines
    releaser_lines = () if releaser is None else (cell_line(releaser.site),)
    # Called inside a function (`finish_episode`): the line to look at is the inner one.
    line = call.site.line if call.site.outer_line not in (None, call.site.line) else None
    at = cell_line(call.site)
    fields = _FreedFields(
        line=at if line is None else line,
        related_lines=tuple(
            sorted({*releaser_lines, *built_lines, *saved_lines, at} - {line or at})
        ),
        holder=name,
        reference=call.site,
        node_ids=tuple(n.id for n in shared),
        buffer_ids=tuple(b.id for b in freed),
        saved_lines=saved_lines if freed else (),
        built_lines=built_lines,
        releaser=None if releaser is None else releaser.site,
    )
    return _with_fix(trace, graph, call, shared, releaser, fields)


def _kept_container(trace: Trace, shared: list[NodeRecord]) -> str | None:
    """The container (`policy.saved_log_probs`) whose elements hold nodes of the freed part,
    when one does."""
    ids = {n.id for n in shared}
    held = Counter(
        holder_group(h.path) for h in trace.holders if "[" in h.path and h.node_id in ids
    )
    return held.most_common(1)[0][0] if held else None


def _with_fix(
    trace: Trace,
    graph: RecordIndex,
    call: BackwardCall,
    shared: list[NodeRecord],
    releaser: BackwardCall | None,
    fields: _FreedFields,
) -> FreedTwice:
    """The fact of the form whose usual fix applies, by how the graphs came to share a part."""
    roots = [n for n in map(graph.node, call.root_ids) if n is not None]
    if releaser is not None and releaser.kind == "grad" and not releaser.create_graph:
        # torch.autograd.grad freed the graph a loss made from its result walks again (a
        # gradient penalty): create_graph=True keeps it and lets the penalty train.
        return FreedByGrad(**fields)
    if releaser is not None and roots and all(r.born_seq < releaser.seq for r in roots):
        # Two losses from one forward, backpropagated one after the other.
        return FreedByTwoLosses(**fields, first=root_name(trace, releaser.root_ids))
    container = _kept_container(trace, shared)
    if container is not None:
        # Results kept in a list reach the next loss: REINFORCE's `saved_log_probs` never
        # emptied, or a PPO rollout kept with its graphs and read again by every epoch.
        refilled = releaser is None or _filled_after(trace, graph, container, releaser.seq)
        return FreedKeptContainer(**fields, container=container, refilled=refilled)
    carried = [n.born_site for n in shared if _built_in_two_epochs(trace, graph, n.born_site)]
    if carried:
        site, holder = _carried_site(trace, graph, carried)
        return FreedCarried(
            **fields,
            carried_line=cell_line(site),
            carried=holder,
            is_tuple=is_tuple(trace, holder),
            fast_weights=from_gradients(trace, site),
        )
    if not shared:
        return FreedUnshared(**fields)
    widest = _widest_holder(trace, graph, shared)
    return FreedBuiltOnce(
        **fields, widest=widest, trains=_cached_from_leaves(graph, shared, widest)
    )


def _cached_from_leaves(graph: RecordIndex, shared: list[NodeRecord], widest: str | None) -> bool:
    """Whether the shared part is a tensor cached on an object (`model.0.masked_weight`, set in
    `__init__`) computed from leaves whose gradient is accumulated: a module's parameters,
    which detaching it would stop training. A plain variable (a target made from an input
    that requires grad by mistake) is not: there detaching fits."""
    if widest is None or "." not in widest:
        return False
    ids = {n.id for n in shared}
    return any(
        (leaf := graph.node(c)) is not None and leaf.name == ACCUMULATE_GRAD
        for n in shared
        for c in n.next_ids
        if c not in ids
    )


def _filled_after(trace: Trace, graph: RecordIndex, container: str, seq: int) -> bool:
    """Whether `container` holds a graph made after event `seq` (it was filled again)."""
    return any(
        (node := graph.node(h.node_id)) is not None and node.born_seq > seq
        for h in trace.holders
        if holder_group(h.path) == container
    )


def _carried_site(trace: Trace, graph: RecordIndex, sites: list[Site]) -> tuple[Site, str]:
    """The carried site and its variable: the last one whose line reads the variable it makes
    (`h = rnn(x, h)`), else the last site."""
    for site in reversed(dict.fromkeys(sites)):
        holder = _carried_holder(trace, graph, site)
        if holder is not None and reads_itself(holder, site):
            return site, holder
    return sites[-1], _carried_holder(trace, graph, sites[-1]) or "h"


def _widest_holder(trace: Trace, graph: RecordIndex, shared: list[NodeRecord]) -> str | None:
    """The variable bound to a shared node with the most of the shared part beneath it."""
    ids = {n.id for n in shared}
    best, best_size = None, 0
    for holder in trace.holders:
        if holder.node_id not in ids:
            continue
        below = graph.reach_within(holder.node_id, ids)
        if len(below) > best_size:
            best, best_size = holder.path, len(below)
    return best


def _built_in_two_epochs(trace: Trace, graph: RecordIndex, site: Site) -> bool:
    epochs = {graph.epoch(n.born_seq) for n in trace.nodes if n.born_site == site}
    return len(epochs) > 1
