"""Workload 7: the live panel's share of workload 2, the graph view's render time, and (in
`report_cost`) the finished panel's cost at the end of a long loop and a full trace's reports.

The share is measured on a block of MLP steps (long enough for the panel's throttled refresh to
fire, as in a real training cell): tracked with the live panel attached against tracked without,
interleaved. A no-op listener is measured the same way, to separate the cost of the listening
mechanism from the panel's own drawing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import autograd_magic
from autograd_magic import Recorder
from autograd_magic.model.trace import DEFAULT_MAX_RECORDS
from benchmarks import graph_view, report_cost
from benchmarks.results import GRAPH_VIEW_TARGET_S, PANEL_SHARE_TARGET, Row, skipped, verdict
from benchmarks.timing import Ratio, interleave, ratios
from benchmarks.workloads import mlp

# Ways the panel module may offer a live view of a trace, tried in order.
PANEL_ENTRY_POINTS = ("live_panel", "attach", "LivePanel", "TracePanel", "Panel")


def panel_factory() -> Callable[[Recorder], Any] | str:
    """A callable that attaches a live panel to a running recorder, or why there is none."""
    try:
        module = importlib.import_module("autograd_magic.views.panel")
    except ImportError:
        return "pending: panel not available"
    for name in PANEL_ENTRY_POINTS:
        entry = getattr(module, name, None)
        if callable(entry):
            return entry
    return f"pending: autograd_magic.views.panel has none of {', '.join(PANEL_ENTRY_POINTS)}"


def _block(steps: int, attach: Callable[[Recorder], Any] | None) -> Callable[[], None]:
    step = mlp().step

    def run() -> None:
        recorder = autograd_magic.track()
        with recorder:
            view = None if attach is None else attach(recorder)
            for _ in range(steps):
                step()
        close = getattr(view, "close", None)
        if callable(close):
            close()

    return run


def share(attach: Callable[[Recorder], Any], steps: int, rounds: int) -> dict[str, Ratio]:
    """Tracked-with-listener / tracked-without ratios for the panel and a no-op listener."""

    def noop(recorder: Recorder) -> None:
        recorder.listen(lambda _trace: None)

    variants = {
        "tracked": _block(steps, None),
        "panel": _block(steps, attach),
        "noop listener": _block(steps, noop),
    }
    return ratios(interleave(variants, rounds, warmup=1), "tracked")


def measure(
    steps: int, rounds: int, sizes: tuple[int, ...], repeats: int, quick: bool = False
) -> list[Row]:
    """Rows 7a (panel share of workload 2), 7b (graph view render times), 7c (the finished
    panel at the end of workload 10) and 7d (reports of a trace at the record cap)."""
    return [
        _share_row(steps, rounds),
        _render_row(sizes, repeats),
        report_cost.cell_end_row(20 if quick else 1000, 1 if quick else 3, quick),
        report_cost.full_trace_row(2_000 if quick else DEFAULT_MAX_RECORDS, quick),
    ]


def _share_row(steps: int, rounds: int) -> Row:
    target = f"<= {PANEL_SHARE_TARGET:.0%} extra on workload 2"
    attach = panel_factory()
    if isinstance(attach, str):
        what = f"would run: blocks of {steps} MLP steps, tracked with vs without a live panel"
        return skipped("7a", "live panel share of workload 2", attach, target, what)
    found = share(attach, steps, rounds)
    panel, noop = found["panel"], found["noop listener"]
    extra = panel.median - 1
    return Row(
        key="7a",
        workload="live panel share of workload 2",
        ours=f"{extra:+.1%} ({panel.describe()} of tracked)",
        target=target,
        verdict=verdict(extra <= PANEL_SHARE_TARGET),
        details=[
            f"blocks of {steps} MLP steps (workload 2) in one track(); panel attached with "
            f"autograd_magic.views.panel.{getattr(attach, '__name__', attach)}",
            f"a no-op listener alone: {noop.median - 1:+.1%} ({noop.describe()})",
        ],
        ratio=panel.median,
    )


def _render_row(sizes: tuple[int, ...], repeats: int) -> Row:
    target = f"10,000 nodes <= {GRAPH_VIEW_TARGET_S:.0f} s"
    render = graph_view.graph_renderer()
    if isinstance(render, str):
        return skipped("7b", "graph view render", render, target, "would run: plots render")
    ours, peer, details, largest = [], [], [], 0.0
    for nodes in sizes:
        mine, dot, recorded = graph_view.render_times(render, nodes, repeats)
        ours.append(f"{recorded:,} nodes {mine:.2f} s")
        peer.append(f"{recorded:,} nodes {dot * 1e3:.0f} ms")
        largest = mine
    details.append(
        "graph view = layout.graph_view + graph_figure + figure_png (PNG, 100 dpi), median of "
        f"{repeats}; peer = torchviz-style DOT source from a next_functions walk (text only)"
    )
    return Row(
        key="7b",
        workload="graph view render",
        ours="; ".join(ours),
        peer="DOT text: " + "; ".join(peer),
        target=target,
        verdict=verdict(largest <= GRAPH_VIEW_TARGET_S),
        details=details,
    )
