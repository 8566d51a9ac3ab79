"""`analyze(trace)`: the one pass over a trace's records that every report is built from.

An `Analysis` holds the findings as facts (typed data, no words), the live growth signal of a
trace still recording, and the derived tables (module stats, storage groups, graph layouts),
each computed at most once however many renderers read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from autograd_magic.analysis.findings import Fact, find_facts
from autograd_magic.analysis.layout import DEFAULT_MAX_NODES, GraphView, graph_view
from autograd_magic.analysis.live import NodeGrowth, node_growth
from autograd_magic.analysis.module_stats import module_stats
from autograd_magic.analysis.storage import storage_groups
from autograd_magic.model.records import Finding, ModuleStats, NodeRecord, Snapshot, StorageGroup
from autograd_magic.model.trace import Trace


@dataclass
class Analysis:
    """What a trace's records mean, at the moment `analyze` read them."""

    trace: Trace
    snapshot: Snapshot
    facts: tuple[Fact, ...] = ()
    # Findings a file of format 1-3 stored as sentences (None for every other trace).
    stored_findings: tuple[Finding, ...] | None = None
    growth: NodeGrowth | None = None  # only while the block runs
    _views: dict[tuple[int, int | None], GraphView] = field(default_factory=dict, repr=False)

    @cached_property
    def modules(self) -> list[ModuleStats]:
        """One entry per nn.Module that ran in the block, most saved bytes first."""
        t = self.trace
        return module_stats(t.nodes, t.buffers, t.module_calls, t.module_types)

    @cached_property
    def storage_groups(self) -> list[StorageGroup]:
        """Groups of tensors/arrays that share memory, with how each joined and copies beside."""
        t = self.trace
        return storage_groups(t.links, t.labels, t.alive_at_end)

    @cached_property
    def nodes_by_id(self) -> dict[int, NodeRecord]:
        return {n.id: n for n in self.trace.nodes}

    def graph_view(self, max_nodes: int = DEFAULT_MAX_NODES, depth: int | None = None) -> GraphView:
        """The graph laid out in at most `max_nodes` boxes at module `depth` (see
        `analysis.layout.graph_view`), laid out once per choice."""
        key = (max_nodes, depth)
        if key not in self._views:
            self._views[key] = graph_view(self.trace, max_nodes, depth)
        return self._views[key]


def analyze(trace: Trace) -> Analysis:
    """The analysis of `trace` now: facts once it has finished (or as a loaded file stored
    them), the growth signal while it runs."""
    snapshot = trace.snapshot()
    if trace.stored_findings is not None:
        return Analysis(trace, snapshot, stored_findings=tuple(trace.stored_findings))
    if not trace.finished:
        return Analysis(trace, snapshot, growth=node_growth(trace))
    return Analysis(trace, snapshot, facts=tuple(trace_facts(trace)))


def trace_facts(trace: Trace) -> list[Fact]:
    """The facts of a finished trace: as stored by a loaded file, else found now."""
    if trace.stored_facts is not None:
        from autograd_magic.analysis.findings.serial import facts_from_json_list

        return facts_from_json_list(trace.stored_facts)
    return find_facts(trace) if trace.finished else []
