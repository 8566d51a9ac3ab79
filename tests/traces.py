"""Hand-made traces for view tests: records built directly, no recorder runs (as memray's
reporter tests feed hand-made records)."""

from __future__ import annotations

from typing import Any

from autograd_magic.analysis.result import Analysis, analyze
from autograd_magic.model.records import (
    AliasLink,
    BackwardCall,
    Blindspot,
    Finding,
    NodeRecord,
    SavedBuffer,
    Site,
    TimelineSample,
    VersionBump,
)
from autograd_magic.report.build import ReportOptions, report_of
from autograd_magic.report.model import Report
from autograd_magic.trace import Trace


def site(line: int) -> Site:
    return Site("<cell>", line)


def handmade_trace(error: bool = False) -> Trace:
    """x (leaf, line 2) -> Mul (line 2) -> Exp (line 3) -> Sum (line 4); backward at line 5
    with retain_graph released Exp's saved result; Exp freed at line 6; h_view shares h's
    memory (detach), h_copy is a clone; h_view written in place at line 6 and through .data
    (bypass) at line 7; optionally an error at line 7."""
    nodes = [
        NodeRecord(1, "AccumulateGrad", 1, site(2)),
        NodeRecord(2, "MulBackward0", 1, site(2), next_ids=(1,)),
        NodeRecord(3, "ExpBackward0", 2, site(3), (2,), freed_seq=9, freed_site=site(6)),
        NodeRecord(4, "SumBackward0", 3, site(4), next_ids=(3,)),
    ]
    buffers = [
        _buffer(1, 2, True, 1, held_by="user tensor"),
        _buffer(2, 3, False, 2, freed_seq=8, freed_site=site(5)),
        SavedBuffer(3, 4, (1024,), "float32", "cpu", 4096, 4096, False, False, 0, 3, site(4)),
    ]
    trace = Trace.from_records(nodes, buffers)
    trace.backward_calls = [
        BackwardCall("backward", 7, site(5), True, False, 8, 1, 24),
    ]
    trace.timeline = [
        TimelineSample(1, 2, 0, "nodes created", 2),
        TimelineSample(2, 3, 24, "nodes created", 3),
        TimelineSample(3, 4, 4120, "nodes created", 4),
        TimelineSample(7, 4, 4120, "backward start", 5),
        TimelineSample(8, 4, 4096, "buffer released", 5),
        TimelineSample(8, 4, 4096, "backward", 5),
        TimelineSample(9, 3, 4096, "node freed", 6),
    ]
    trace.links = [
        AliasLink(11, 10, "detach", True, 4, site(4)),
        AliasLink(12, 11, "clone", False, 5, site(5)),
    ]
    trace.labels = {10: "h", 11: "h_view", 12: "h_copy"}
    trace.version_bumps = [
        VersionBump("h_view", "add_", 0, 1, 6, site(6), affected=("h",)),
        VersionBump("h_view", "mul_", 1, 1, 7, site(7), bypass=True, bypassed="h"),
    ]
    # Worded as a file of format 1-3 stores them: the report shows these, finds none itself.
    trace.stored_findings = [
        Finding("kept-alive", "`loss` keeps the graph built at line 4 alive.", 4, (2, 3)),
    ]
    trace.blindspots = [Blindspot("compiled", "Code compiled with torch.compile ran.", 3)]
    trace.live_nodes, trace.peak_live_nodes = 3, 4
    trace.retained_bytes, trace.peak_retained_bytes = 4096, 4120
    trace.nodes_created, trace.buffers_saved = 4, 3
    trace.finished = True
    if error:
        trace.error = "RuntimeError: boom."
        trace.error_site = site(7)
    return trace


def module_trace(layers: int = 12, own_ops: int = 1) -> Trace:
    """A finished trace of `model` with `layers` blocks `model.layers.i` ("Block"), each an
    `attn` and an `mlp` child (a parameter leaf, Mm with 1 KiB saved, Relu) and its own residual
    Add (`own_ops` of them, chained); the loss (Sum, line 4) outside any module. 7 nodes per
    block by default, plus the Sum."""
    nodes: list[NodeRecord] = []
    buffers: list[SavedBuffer] = []
    calls = {"model": 1}
    types = {"model": "Net", "model.layers": "ModuleList"}

    def node(name: str, module: str | None, nexts: tuple[int | None, ...], line: int = 3) -> int:
        nid = len(nodes) + 1
        kept = tuple(n for n in nexts if n is not None)
        nodes.append(NodeRecord(nid, name, nid, site(line), kept, module=module))
        return nid

    prev: int | None = None
    for i in range(layers):
        block = f"model.layers.{i}"
        calls[block], types[block] = 1, "Block"
        start = prev
        for child, kind in (("attn", "Attention"), ("mlp", "MLP")):
            path = f"{block}.{child}"
            calls[path], types[path] = 1, kind
            weight = node("AccumulateGrad", path, ())
            mm = node("MmBackward0", path, (prev, weight))
            buffers.append(
                SavedBuffer(
                    len(buffers) + 1,
                    mm,
                    (256,),
                    "float32",
                    "cpu",
                    1024,
                    1024,
                    False,
                    False,
                    0,
                    mm,
                    site(3),
                    module=path,
                )
            )
            prev = node("ReluBackward0", path, (mm,))
        for _ in range(own_ops):
            prev = node("AddBackward0", block, (prev, start))
    node("SumBackward0", None, (prev,), line=4)
    return Trace.from_records(nodes, buffers, module_calls=calls, module_types=types, finished=True)


def report(trace: Trace, block: str = "block", **options: Any) -> Report:
    """The report every renderer lowers, of `trace` as it is now."""
    return report_of(trace, ReportOptions(block=block, **options))


def analysis(trace: Trace) -> Analysis:
    """The analysis of `trace` as it is now (what the report's parts read)."""
    return analyze(trace)


def _buffer(buffer_id: int, node_id: int, is_leaf: bool, seq: int, **fields: Any) -> SavedBuffer:
    """A 2 x 3 float32 buffer saved at line `node_id` (the handmade trace's shape)."""
    return SavedBuffer(
        *(buffer_id, node_id, (2, 3), "float32", "cpu", 24, 24, is_leaf, False, 0, seq),
        site(node_id),
        **fields,
    )
