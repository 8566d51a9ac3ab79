"""Workload 7, rows c and d: what rendering costs at the end of a cell and on a full trace.

7c: workload 10's loop (1,000 small-MLP steps) runs in one `track()` block with a live panel
attached, as `%%trackgraph` does; then the cell's end is timed as the magic does it:
`panel.finish()` (the widget: summary, findings, timeline; graph and tables wait for their tab)
and `panel.static_copy()` (the saved output: every section, pictures included). Each is a share
of the loop's own time in the same round.

7d: a trace at the 100,000-node-record cap, made by repeating the records of a recorded loop of
workload 10 (ids, sequence numbers and edges shifted per copy), rendered three ways: the text
report, the static HTML (timeline and graph pictures) and the panel with its static copy.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import autograd_magic
from autograd_magic.model.trace import DEFAULT_MAX_RECORDS
from autograd_magic.trace import Trace
from benchmarks.results import PANEL_SHARE_TARGET, REPORT_TARGET_S, Row, verdict
from benchmarks.workloads import long_loop


def _loop(steps: int, quick: bool) -> tuple[Trace, float, float, float]:
    """(trace, loop seconds, widget finish seconds, static copy seconds) of one cell."""
    from autograd_magic.views.panel import live_panel

    step = long_loop(quick).step
    recorder = autograd_magic.track()
    with recorder as trace:
        panel = live_panel(recorder)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        loop = time.perf_counter() - start
    start = time.perf_counter()
    panel.finish()
    finished = time.perf_counter() - start
    panel.static_copy()
    static = time.perf_counter() - start - finished
    panel.close()
    return trace, loop, finished, static


def cell_end_row(steps: int, rounds: int, quick: bool) -> Row:
    """Row 7c: the finished panel's cost at the end of workload 10's loop, as a share of it."""
    found = [_loop(steps, quick) for _ in range(rounds + 1)][1:]  # the first warms caches
    widget = statistics.median(f / loop for _, loop, f, _ in found)
    whole = statistics.median((f + s) / loop for _, loop, f, s in found)
    trace, loop, finished, static = found[len(found) // 2]
    return Row(
        key="7c",
        workload="finished panel at the end of workload 10",
        ours=f"widget {widget:.1%}; with its static copy {whole:.1%} of the loop",
        target=f"<= {PANEL_SHARE_TARGET:.0%} of the cell",
        verdict=verdict(whole <= PANEL_SHARE_TARGET),
        details=[
            f"{steps:,} steps in one track() block with a live panel ({len(trace.nodes):,} node "
            f"records, {len(trace.timeline):,} timeline samples); median of {rounds} rounds",
            f"one round: loop {loop:.2f} s, panel.finish() {finished * 1e3:.0f} ms (summary, "
            f"findings, timeline; graph and tables are built when their tab is opened), "
            f"panel.static_copy() {static * 1e3:.0f} ms (every section with pictures, for "
            "saved notebooks)",
        ],
    )


def scaled(trace: Trace, records: int) -> Trace:
    """`trace`'s nodes and buffers repeated until there are `records` node records."""
    span = max((n.id for n in trace.nodes), default=0) + 1
    seqs = trace.seq + 1
    nodes, buffers = [], []
    copies = -(-records // max(1, len(trace.nodes)))
    for k in range(copies):
        shift, later = k * span, k * seqs
        for n in trace.nodes:
            nodes.append(
                replace(
                    n,
                    id=n.id + shift,
                    born_seq=n.born_seq + later,
                    next_ids=tuple(c + shift for c in n.next_ids),
                    freed_seq=None if n.freed_seq is None else n.freed_seq + later,
                )
            )
        buffers += [
            replace(b, id=b.id + shift, node_id=None if b.node_id is None else b.node_id + shift)
            for b in trace.buffers
        ]
    big = copy.copy(trace)
    big.nodes, big.buffers = nodes[:records], buffers
    return big


def _seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def full_trace_row(records: int, quick: bool) -> Row:
    """Row 7d: text report, static HTML and panel of a trace at the node-record cap."""
    from autograd_magic.views import html, panel, text

    base, *_ = _loop(100 if quick else 1000, quick)
    renders = {  # each from the trace: its analysis and report are part of the cost
        "text report": lambda t: text.render_text(t.report()),
        "static HTML": lambda t: html.static_html(t.report()),
        "panel + static copy": lambda t: panel.TracePanel(t).static_copy(),
    }
    times = {}
    for name, render in renders.items():
        big = scaled(base, records)  # a fresh trace each: no analysis shared between renders
        times[name] = _seconds(lambda render=render, big=big: render(big))
    worst = max(times.values())
    return Row(
        key="7d",
        workload=f"report of a {records:,}-node trace",
        ours="; ".join(f"{name} {s:.2f} s" for name, s in times.items()),
        target=f"<= {REPORT_TARGET_S:.0f} s each",
        verdict=verdict(worst <= REPORT_TARGET_S),
        details=[
            f"{records:,} node records (the default cap is {DEFAULT_MAX_RECORDS:,}) and "
            f"{len(scaled(base, records).buffers):,} saved-tensor records: a recorded loop of "
            "workload 10 repeated; one run each, on a fresh trace",
        ],
    )
