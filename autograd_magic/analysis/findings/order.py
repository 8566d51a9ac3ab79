"""Which facts explain which, and the order they are said in: a cause before what follows from
it. A crash's cause comes before the graphs the crash left unused; a `retain_graph=True` that
kept saved memory comes before the variable that keeps those graphs alive."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import get_args

from autograd_magic.analysis.findings.facts import (
    Fact,
    KeptChain,
    KeptContainer,
    RetainedGraph,
    UnusedGraphs,
)
from autograd_magic.analysis.index import RecordIndex
from autograd_magic.model.records import FindingKind
from autograd_magic.model.trace import Trace

KINDS: tuple[FindingKind, ...] = get_args(FindingKind)


def left_by_crash(trace: Trace, graph: RecordIndex, facts: list[Fact]) -> list[Fact]:
    """`facts` with each unused-graph fact whose graphs were all built after the last backward
    that succeeded marked as left by the crash (`crashed`): the block's error, or a failed last
    backward (its error caught inside the block), ended the step before the backward that
    would have used them."""
    last = trace.backward_calls[-1] if trace.backward_calls else None
    crashed = trace.error_site if trace.error is not None else None
    if crashed is None and last is not None and last.error is not None:
        crashed = last.site
    if crashed is None:
        return facts
    done = [c.end_seq or c.seq for c in trace.backward_calls if c.error is None]
    last_ok = max(done, default=-1)
    out = []
    for fact in facts:
        if isinstance(fact, UnusedGraphs) and all(
            (node := graph.node(i)) is None or node.born_seq > last_ok for i in fact.node_ids
        ):
            fact = dataclasses.replace(fact, crashed=crashed)
        out.append(fact)
    return out


def kept_by_retain(graph: RecordIndex, facts: list[Fact]) -> list[Fact]:
    """`facts` with each kept-alive fact whose graphs hold saved tensors a `retain_graph=True`
    call kept marked with that call (`retained_at`): without the retain the graphs would hold
    no saved memory, so the retain is said first and the holder follows from it."""
    retained = [f for f in facts if isinstance(f, RetainedGraph) and f.cause is None]
    if not retained:
        return facts
    out: list[Fact] = []
    keepers: dict[int, str | None] = {}  # id of a retained-graph fact -> who keeps its graphs
    for fact in facts:
        if isinstance(fact, (KeptChain, KeptContainer)) and fact.nbytes:
            held = {b.id for b in graph.buffers_of(fact.node_ids, live=True)}
            by = next((r for r in retained if held.intersection(r.buffer_ids)), None)
            if by is not None and by.line is not None:
                related = tuple(sorted({*fact.related_lines, by.line} - {fact.line}))
                fact = dataclasses.replace(fact, retained_at=by.reference, related_lines=related)
                keepers.setdefault(id(by), fact.holder)
        out.append(fact)
    return [
        dataclasses.replace(f, kept_by=keepers[id(f)])
        if isinstance(f, RetainedGraph) and id(f) in keepers
        else f
        for f in out
    ]


def in_cause_order(facts: Sequence[Fact]) -> list[Fact]:
    """Root causes first (a carried value; a retain_graph=True that kept what a variable
    holds), then what follows from a cause, then what keeps graphs alive, then the rest by line;
    graphs a crash left unused come last, after the crash's cause."""
    causes = {
        id(f)
        for f in facts
        if isinstance(f, RetainedGraph)
        and any(
            isinstance(k, (KeptChain, KeptContainer)) and k.retained_at == f.reference
            for k in facts
        )
    }

    def rank(f: Fact) -> tuple[int, int, int]:
        if f.kind == "graph-growth" or id(f) in causes:
            first = 0
        elif f.cause is not None or getattr(f, "retained_at", None) is not None:
            first = 1
        elif f.kind == "kept-alive":
            first = 2
        elif isinstance(f, UnusedGraphs) and f.crashed is not None:
            first = 4
        else:
            first = 3
        return (first, f.line or 0, KINDS.index(f.kind))

    return sorted(facts, key=rank)
