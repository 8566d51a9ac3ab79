"""Matplotlib renderers of a `Trace`: the memory timeline and the layered autograd graph.

Figures are built from `matplotlib.figure.Figure` directly, never through pyplot, so nothing is
registered globally and a figure is freed with its last reference. The graph is drawn from a
`GraphView` laid out by `analysis.layout`.
"""

from __future__ import annotations

import io
import itertools
import math

import numpy
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MultipleLocator

from autograd_magic.analysis.layout import Box, GraphView
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import ACCUMULATE_GRAD, format_bytes

ALIVE, FREED, LEAF = "#e8590c", "#adb5bd", "#2f9e44"
NODES_COLOR, BYTES_COLOR, BACKWARD_COLOR, ERROR_COLOR = "#1c7ed6", "#e8590c", "#7048e8", "#e03131"
LABEL_LIMIT = 60


def graph_figure(view: GraphView, selected: int | None = None, width: float = 9.0) -> Figure:
    """The layered graph: leaves at the top, the loss at the bottom, size by saved bytes."""
    boxes = view.boxes
    depth = 1 + max((b.layer for b in boxes), default=0)
    fig = Figure(figsize=(width, min(12.0, max(3.0, 0.9 + 0.5 * depth))), layout="constrained")
    ax = fig.add_subplot()
    ax.set_axis_off()
    if not boxes:
        ax.text(0.5, 0.5, "No autograd nodes recorded", ha="center", transform=ax.transAxes)
        return fig
    xs = [b.x for b in boxes]
    ys = [-b.layer for b in boxes]
    # One NaN-separated polyline for all edges: several times faster to draw than a
    # LineCollection of 10,000 segments.
    edge_x: list[float] = []
    edge_y: list[float] = []
    for a, b in view.edges:
        edge_x += (xs[a], xs[b], math.nan)
        edge_y += (ys[a], ys[b], math.nan)
    many = len(view.edges) > 2000  # antialiasing thousands of overlapping edges is the slow part
    ax.plot(edge_x, edge_y, color="#a5acb3", lw=0.6, zorder=1, antialiased=not many)
    biggest = max(b.saved_bytes for b in boxes) or 1
    sizes = [30 + 470 * math.sqrt(b.saved_bytes / biggest) for b in boxes]
    rgba = {c: to_rgba(c) for c in (LEAF, ALIVE, FREED)}  # an array: names parse slowly
    colours = numpy.array([rgba[LEAF if b.leaf else ALIVE if b.alive else FREED] for b in boxes])
    ax.scatter(xs, ys, s=sizes, c=colours, edgecolors="#343a40", linewidths=0.4, zorder=2)
    if selected is not None and 0 <= selected < len(boxes):
        ax.scatter(
            [xs[selected]],
            [ys[selected]],
            s=sizes[selected] + 250,
            facecolors="none",
            edgecolors=ERROR_COLOR,
            linewidths=2.0,
            zorder=3,
        )
    if len(boxes) <= LABEL_LIMIT:
        for box, x, y in zip(boxes, xs, ys, strict=True):
            ax.annotate(
                _short_label(box),
                (x, y),
                xytext=(0, -9),
                textcoords="offset points",
                ha="center",
                va="top",
                fontsize=7,
                zorder=4,
            )
    ax.margins(0.08, 0.15)
    ax.autoscale_view()
    handles = [
        Line2D([], [], marker="o", ls="", color=c, label=t)
        for c, t in ((ALIVE, "alive"), (FREED, "freed"), (LEAF, "leaf (AccumulateGrad)"))
    ]
    ax.legend(handles=handles, loc="upper right", fontsize=7, framealpha=0.8)
    ax.set_title("inputs (leaves) at the top, the loss at the bottom; size = saved bytes", size=8)
    return fig


def _short_label(box: Box) -> str:
    name = "leaf" if box.name == ACCUMULATE_GRAD else box.name.replace("Backward0", "")
    name = name.replace("Backward1", "")
    count = f" x{len(box.members)}" if len(box.members) > 1 else ""
    line = box.where.replace("line ", "L").split(",")[0]
    text = f"{name}{count} {line}"
    return f"{text}\n{format_bytes(box.saved_bytes)}" if box.saved_bytes else text


def timeline_figure(trace: Trace, width: float = 9.0, height: float = 3.2) -> Figure:
    """Live nodes and retained bytes over recorded events; backward calls and big drops marked."""
    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot()
    samples = list(trace.timeline)
    if not samples:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "Nothing recorded yet", ha="center", transform=ax.transAxes)
        return fig
    seqs = [s.seq for s in samples]
    ax.step(seqs, [s.live_nodes for s in samples], where="post", color=NODES_COLOR, lw=1.4)
    ax.set_ylabel("live autograd nodes", color=NODES_COLOR, fontsize=8)
    ax.set_xlabel("recorded events, in order (labels give the cell line)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax2 = ax.twinx()
    retained = [s.retained_bytes for s in samples]
    ax2.fill_between(seqs, retained, step="post", color=BYTES_COLOR, alpha=0.25, lw=0)
    ax2.step(seqs, retained, where="post", color=BYTES_COLOR, lw=1.0)
    ax2.set_ylabel("retained saved tensors", color=BYTES_COLOR, fontsize=8)
    ax2.yaxis.set_major_locator(MultipleLocator(byte_tick_step(max(retained))))
    ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(int(v))))
    ax2.tick_params(labelsize=7)
    ax.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    ax.set_zorder(ax2.get_zorder() + 1)  # the node line over the bytes fill
    ax.patch.set_visible(False)
    _mark_backward(ax, samples)
    _mark_drops(ax, samples)
    if trace.error:
        line = (
            samples[-1].line
            if trace.error_site is None
            else trace.error_site.outer_line or trace.error_site.line
        )
        ax.axvline(seqs[-1], color=ERROR_COLOR, ls="--", lw=1.2)
        _vlabel(ax, seqs[-1], f"error L{line}", ERROR_COLOR)
    return fig


def byte_tick_step(top: int, most_ticks: int = 6) -> int:
    """A tick spacing in whole binary units (1, 2 or 5 x B, KiB, MiB...), so labels read 2.0 KiB
    rather than 1000 B beside 2.0 KiB."""
    unit = 1
    while unit * 1024 <= top:
        unit *= 1024
    for nice in (1, 2, 5, 10, 20, 50, 100, 200, 500):
        if top / (unit * nice) <= most_ticks:
            return unit * nice
    return unit * 1024


def _vlabel(ax: object, x: float, text: str, colour: str) -> None:
    ax.annotate(  # type: ignore[attr-defined]
        text,
        (x, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(2, -2),
        textcoords="offset points",
        rotation=90,
        va="top",
        fontsize=7,
        color=colour,
    )


def _mark_backward(ax: object, samples: list) -> None:
    """Shade each backward call; label at most 12 of them, first occurrence of each line first."""
    spans, start = [], None
    for s in samples:
        if s.what == "backward start":
            start = s
        elif s.what == "backward" and start is not None:
            spans.append((start.seq, s.seq, s.line))
            start = None
    seen: set[int] = set()
    labelled = 0
    for first, last, line in spans:
        ax.axvspan(first, max(last, first + 0.5), color=BACKWARD_COLOR, alpha=0.18, lw=0)  # type: ignore[attr-defined]
        if labelled < 12 and (line not in seen or len(spans) <= 12):
            _vlabel(ax, first, f"backward L{line}", BACKWARD_COLOR)
            labelled += 1
        seen.add(line)


def _mark_drops(ax: object, samples: list) -> None:
    """Mark the six largest falls in live nodes (graphs being freed) with their line."""
    peak = max(s.live_nodes for s in samples) or 1
    drops = []
    for before, after in itertools.pairwise(samples):
        fall = before.live_nodes - after.live_nodes
        if fall >= max(1, 0.1 * peak):
            drops.append((fall, after.seq, after.live_nodes, after.line))
    for _, seq, live, line in sorted(drops, reverse=True)[:6]:
        ax.plot([seq], [live], marker="v", color=NODES_COLOR, ms=6)  # type: ignore[attr-defined]
        ax.annotate(  # type: ignore[attr-defined]
            f"freed L{line}",
            (seq, live),
            xytext=(3, 6),
            textcoords="offset points",
            fontsize=7,
            color=NODES_COLOR,
        )


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes (white background: readable in light and dark themes)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, facecolor="white")
    return buffer.getvalue()
