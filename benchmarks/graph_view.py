"""Workload 7, second half: time to render the graph view of 1,000- and 10,000-node graphs.

The graph is recorded for real (a residual chain `h = (h * w).tanh() + h`, three nodes per
step, with skip edges), then rendered the way the panel shows it: `layout.graph_view` (layout and
collapsing), `figures.graph_figure` and `figures.figure_png`. The peer is a torchviz-style DOT
rendering: a pure-Python walk of `next_functions` from the live output, producing DOT source
text, as torchviz's `make_dot` does before graphviz (not installed here) draws it.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import autograd_magic
from autograd_magic.model.trace import Trace

NODES_PER_STEP = 3


def recorded_graph(nodes: int) -> tuple[Trace, torch.Tensor]:
    """A trace of about `nodes` autograd nodes, and the live output that keeps them alive."""
    h = torch.randn(8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    with autograd_magic.track(namespace={}) as trace:
        for _ in range(nodes // NODES_PER_STEP):
            h = (h * w).tanh() + h
    return trace, h


def dot_source(root: Any) -> str:
    """torchviz-style DOT text for the graph behind `root` (a grad_fn): one box per node."""
    lines = ["digraph {", '  node [shape=box fontsize=12 style=filled fillcolor="#eeeeee"]']
    seen: set[Any] = set()
    stack = [root]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        label = type(fn).__name__
        variable = getattr(fn, "variable", None)
        if variable is not None:
            label += "\\n" + "(" + ", ".join(str(s) for s in variable.shape) + ")"
        lines.append(f'  {id(fn)} [label="{label}"]')
        for child, _ in fn.next_functions:
            if child is not None:
                lines.append(f"  {id(child)} -> {id(fn)}")
                stack.append(child)
    lines.append("}")
    return "\n".join(lines)


def graph_renderer() -> Callable[[Trace], object] | str:
    """The graph-view render as the panel does it, or why it is not available."""
    try:
        layout = importlib.import_module("autograd_magic.analysis.layout")
        plots = importlib.import_module("autograd_magic.views.figures")
    except ImportError as exc:
        return f"pending: the graph view is not importable ({exc})"

    def render(trace: Trace) -> object:
        return plots.figure_png(plots.graph_figure(layout.graph_view(trace)))

    return render


def _median_s(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def render_times(
    render: Callable[[Trace], object], nodes: int, repeats: int
) -> tuple[float, float, int]:
    """(graph view seconds, DOT peer seconds, recorded node count), medians of `repeats`."""
    trace, output = recorded_graph(nodes)
    ours = _median_s(lambda: render(trace), repeats)
    peer = _median_s(lambda: dot_source(output.grad_fn), repeats)
    return ours, peer, len(trace.nodes)
