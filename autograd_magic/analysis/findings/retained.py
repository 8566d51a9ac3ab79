"""Retained-graph facts: `retain_graph=True` calls whose kept saved tensors no later backward
released, and the variable that really keeps them."""

from __future__ import annotations

from autograd_magic.analysis.findings.facts import GraphGrowth, RetainedGraph
from autograd_magic.analysis.findings.lifetime import holder_group, root_name
from autograd_magic.analysis.findings.source import own_line, traced_path
from autograd_magic.analysis.index import RecordIndex, retained_bytes_of
from autograd_magic.model.records import BackwardCall, SavedBuffer
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import ACCUMULATE_GRAD


def retained_graph(
    trace: Trace, graph: RecordIndex, cause: GraphGrowth | None
) -> list[RetainedGraph]:
    """`retain_graph=True` calls whose kept buffers no later backward released; `cause` is the
    graph-growth fact that made them seem needed, when there is one."""
    retained: list[BackwardCall] = []
    later: set[int] = set()  # nodes reached by the calls after the one looked at
    for call in reversed(trace.backward_calls):
        # Every iteration's graph ends in the same parameters' AccumulateGrad: reaching those
        # again is no reuse of this call's graph.
        reached = [i for i in call.reached if not _accumulator(graph, i)]
        # create_graph=True retains on purpose, for the backward through the gradients; and a
        # retained graph a later backward walked again (a GAN's generator step) was needed:
        # without a carried value behind it, what broke there is the cause, not the retain.
        if call.retain_graph and not call.create_graph and (cause or later.isdisjoint(reached)):
            retained.append(call)
        later.update(reached)
    by_line: dict[int, list[BackwardCall]] = {}
    file = traced_path(trace)  # a backward inside the user's function: said at its own line
    for call in reversed(retained):
        by_line.setdefault(own_line(call.site, file), []).append(call)
    facts = []
    for line, every in by_line.items():
        calls = [c for c in every if c.error is None and c.reached]
        kept = graph.buffers_of({n for c in calls for n in c.reached}, live=True)
        nbytes = retained_bytes_of(kept)
        if not nbytes:
            continue
        holder, also, root, root_only = _keepers(trace, graph, kept, calls, cause)
        facts.append(
            RetainedGraph(
                line=line,
                related_lines=tuple(sorted({own_line(b.saved_site, file) for b in kept})),
                holder=holder,
                also_held_by=also,
                root_holder=root,
                root_only_bytes=root_only,
                nbytes=nbytes,
                cause=cause,
                reference=calls[-1].site,
                buffer_ids=tuple(b.id for b in kept),
                # Every call counts, the one that raised too: the user ran the line that often.
                times=len(every),
            )
        )
    return facts


def _accumulator(graph: RecordIndex, node_id: int) -> bool:
    node = graph.node(node_id)
    return node is not None and node.name == ACCUMULATE_GRAD


def _keepers(
    trace: Trace,
    graph: RecordIndex,
    kept: list[SavedBuffer],
    calls: list[BackwardCall],
    cause: GraphGrowth | None,
) -> tuple[str | None, tuple[str, ...], str | None, int]:
    """(holder, other holders, root holder, bytes only the root holder keeps). With a carried
    value whose graph reaches more than half of the kept bytes, the holder is that value (a
    carried `hidden` keeps them after `loss` is rebound), the other holders are the variables
    besides the backpropagated root that reach as much, and the root's holder is named apart;
    otherwise the holder is the root's own, as before."""
    root = root_name(trace, calls[-1].root_ids)
    carried = None if cause is None else cause.holder
    if carried is None:
        return root, (), None, 0
    root_group = None if root is None else holder_group(root)
    # A carried `hidden` is walked only by the next iteration's backward: any live holder counts.
    groups: dict[str, list[int]] = {}
    for h in trace.holders:
        if (node := graph.node(h.node_id)) is not None and node.alive:
            groups.setdefault(holder_group(h.path), []).append(h.node_id)
    reach = {name: graph.live_reach(ids) for name, ids in groups.items() if name != root_group}
    total = retained_bytes_of(kept)
    covered = {
        name: retained_bytes_of([b for b in kept if b.node_id in nodes])
        for name, nodes in reach.items()
    }
    if 2 * covered.get(carried, 0) <= total:
        return root, (), None, 0
    also = [n for n, b in sorted(covered.items(), key=lambda item: -item[1]) if 2 * b > total]
    others = set().union(*reach.values())
    own = graph.live_reach(groups.get(root_group or "", [])) - others
    own_bytes = retained_bytes_of([b for b in kept if b.node_id in own])
    return carried, tuple(n for n in also if n != carried)[:2], root, own_bytes
