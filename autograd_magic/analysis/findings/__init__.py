"""Findings as facts: what the records mean for the user, as data naming variables and lines.

Pure functions of a finished `Trace` (records only, no live objects), so they run the same on a
trace loaded from JSON. The root-cause pass (graph-growth) runs first and its fact is passed to
the passes whose facts follow from it. `autograd_magic.report.wording` words the facts.
"""

from __future__ import annotations

from autograd_magic.analysis.findings.facts import (
    FACT_TYPES,
    Fact,
    FreedKeptContainer,
    Leftover,
    SavedBy,
)
from autograd_magic.analysis.findings.growth import backward_through_freed, graph_growth
from autograd_magic.analysis.findings.lifetime import kept_alive, unused_graph
from autograd_magic.analysis.findings.order import (
    KINDS,
    in_cause_order,
    kept_by_retain,
    left_by_crash,
)
from autograd_magic.analysis.findings.retained import retained_graph
from autograd_magic.analysis.findings.writes import data_bypass, inplace_on_saved, shared_write
from autograd_magic.analysis.index import RecordIndex
from autograd_magic.model.trace import Trace


def find_facts(trace: Trace) -> list[Fact]:
    """All facts for a finished trace, in cause order (see `order.in_cause_order`): the root
    cause and its consequences first, then what keeps graphs alive, then the rest in the order
    of the lines they point at, and graphs a crash left unused after the crash's cause."""
    graph = RecordIndex(trace)
    cause = graph_growth(trace, graph)
    kept = kept_alive(trace, graph)
    if cause is not None:  # the root cause names the variable; no second fact about it
        kept = [f for f in kept if f.holder != cause.holder]
    freed = backward_through_freed(trace, graph)
    # A list whose old results broke the next backward is said once, with the error it caused
    # (and the fix that fits: empty it, not detach what a policy gradient needs).
    emptied = {f.container for f in freed if isinstance(f, FreedKeptContainer)}
    kept = [f for f in kept if f.holder not in emptied]
    unused = unused_graph(trace, graph)
    # A variable holding graphs no backward used is one finding, about the variable.
    kept_names = {f.holder for f in kept} | emptied
    unused = [f for f in unused if isinstance(f, Leftover) or f.holder not in kept_names]
    facts: list[Fact] = [
        *kept,
        *([] if cause is None else [cause]),
        *retained_graph(trace, graph, cause),
        *freed,
        *inplace_on_saved(trace, graph, cause),
        *shared_write(trace, graph),
        *data_bypass(trace, graph, cause),
        *unused,
    ]

    facts = kept_by_retain(graph, left_by_crash(trace, graph, facts))
    return in_cause_order(facts)


__all__ = ["FACT_TYPES", "KINDS", "Fact", "SavedBy", "find_facts"]
