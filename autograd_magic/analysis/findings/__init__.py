"""Findings: what the records mean for the user, as plain sentences naming variables and lines.

Pure functions of a finished `Trace` (records only, no live objects), so they run the same on a
trace loaded from JSON. Each kind is one small function; `analyze` runs them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from autograd_magic.analysis.findings.common import RecordIndex
from autograd_magic.analysis.findings.graphs import (
    backward_through_freed,
    graph_growth,
    kept_alive,
    retained_graph,
    unused_graph,
)
from autograd_magic.analysis.findings.writes import data_bypass, inplace_on_saved, shared_write
from autograd_magic.model.records import Finding, FindingKind
from autograd_magic.model.trace import Trace

KINDS: tuple[FindingKind, ...] = get_args(FindingKind)

_ANALYSES: tuple[Callable[[Trace, RecordIndex], list[Finding]], ...] = (
    kept_alive,
    graph_growth,
    retained_graph,
    backward_through_freed,
    inplace_on_saved,
    shared_write,
    data_bypass,
    unused_graph,
)


def analyze(trace: Trace) -> list[Finding]:
    """All findings for a finished trace: a root cause and its consequences first, then what
    keeps graphs alive, then the rest in the order of the lines they point at."""
    graph = RecordIndex(trace)
    findings = [f for analysis in _ANALYSES for f in analysis(trace, graph)]
    growing = {f.holder for f in findings if f.kind == "graph-growth"}
    findings = [f for f in findings if not (f.kind == "kept-alive" and f.holder in growing)]
    # The root cause first, then what follows from it, then the rest in line order.
    consequences = {id(f) for f in graph.consequences}

    def rank(f: Finding) -> tuple[int, int, int]:
        # A variable keeping graphs alive explains the writes and errors on those graphs.
        first = (
            0
            if f.kind == "graph-growth"
            else 1
            if id(f) in consequences
            else 2
            if f.kind == "kept-alive"
            else 3
        )
        return (first, f.line or 0, KINDS.index(f.kind))

    return sorted(findings, key=rank)


__all__ = ["KINDS", "analyze"]
