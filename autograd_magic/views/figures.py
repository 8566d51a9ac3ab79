"""Matplotlib renderers of a report: the memory timeline and the layered autograd graph.

Figures are built from `matplotlib.figure.Figure` directly, never through pyplot, so nothing is
registered globally and a figure is freed with its last reference. The graph is drawn from a
`GraphView` laid out by `analysis.layout`.
"""

from __future__ import annotations

import io
import itertools
import math
from typing import Any

import numpy
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

from autograd_magic.model.records import BackwardCall
from autograd_magic.model.units import format_bytes
from autograd_magic.report.model import Box, GraphView, Timeline
from autograd_magic.views.graph_labels import draw_labels
from autograd_magic.views.series import envelope, x_axis

ALIVE, FREED, LEAF = "#e8590c", "#adb5bd", "#2f9e44"
RELEASED = "#f7b98f"  # alive, but its saved tensors already released (a pale ALIVE)
# Mid tones, each over 4:1 against both white and JupyterLab's dark background (#111).
NODES_COLOR, BYTES_COLOR, BACKWARD_COLOR, ERROR_COLOR = "#1c7ed6", "#e8590c", "#845ef7", "#e03131"
INK = "#7b8189"  # text and axes: about 4:1 contrast on both white and JupyterLab dark
LABEL_LIMIT = 200  # boxes; a labelled figure grows tall enough for its labels


def graph_figure(view: GraphView, selected: int | None = None, width: float = 9.0) -> Figure:
    """The layered graph: inputs at the top, the loss at the bottom, size by the bytes each box
    ever saved for backward (released or not; colour tells alive from freed), each box labelled
    when there are at most `LABEL_LIMIT`."""
    boxes = view.boxes
    depth = 1 + max((b.layer for b in boxes), default=0)
    tallest = 60.0 if len(boxes) <= LABEL_LIMIT else 12.0  # two lines of 7 pt: 0.4 in a layer
    height = min(tallest, max(3.0, 0.9 + 0.4 * depth))
    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.add_subplot()
    ax.set_axis_off()
    if not boxes:
        ax.text(
            0.5, 0.5, "No autograd nodes recorded", ha="center", transform=ax.transAxes, color=INK
        )
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
    rgba = {c: to_rgba(c) for c in (LEAF, ALIVE, RELEASED, FREED)}  # names parse slowly
    colours = numpy.array([rgba[_colour(b)] for b in boxes])
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
    ax.margins(0.08, 0.5 / depth)
    ax.autoscale_view()
    left_out = draw_labels(ax, boxes, xs, ys, sizes, width, INK) if len(boxes) <= LABEL_LIMIT else 0
    _legend(ax, view, left_out)
    return fig


def _colour(box: Box) -> str:
    """Leaf; alive and holding saved tensors; alive and holding none (released, or it saved
    none); freed."""
    if box.leaf:
        return LEAF
    if not box.alive:
        return FREED
    return ALIVE if box.held_bytes else RELEASED


def _legend(ax: Any, view: GraphView, left_out: int = 0) -> None:
    """The colours below the drawing; above it, how to read it and how many labels it lacks
    (said there, not in a corner of the drawing, where a dot may be)."""
    handles = [
        Line2D([], [], marker="o", ls="", color=c, label=t)
        for c, t in (
            (ALIVE, "alive, holds saved tensors"),
            (RELEASED, "alive, holds none (released or never saved)"),
            (FREED, "freed"),
            (LEAF, "leaf (AccumulateGrad)"),
        )
    ]
    # Below the drawing, not over it: a wide graph reaches every corner.
    ax.figure.legend(
        handles=handles,
        loc="outside lower center",
        ncols=4,
        fontsize=7,
        frameon=False,
        labelcolor=INK,
    )
    grouped = (
        f"one box per module at depth {view.depth} (its parameters inside)"
        if view.depth > 0
        else "each input (leaf) one layer above the ops that use it"
    )
    missing = f"\n{left_out:,} labels left out where they would overlap." if left_out else ""
    ax.set_title(
        f"The loss is at the bottom; {grouped}.\n"
        "Dot size: bytes saved for backward while recording, released ones included." + missing,
        size=8,
        color=INK,
    )


def timeline_figure(
    timeline: Timeline, width: float = 9.0, height: float = 3.8, dpi: int = 100
) -> Figure:
    """Live nodes (top) and retained bytes (bottom) over steps (when the block called backward
    `MIN_STEPS` times or more: step k ends with backward call k) or over recorded events; drawn as
    a min-max envelope per pixel column when samples outnumber columns; backward calls, big drops
    and the error marked with their lines."""
    # Fixed margins: constrained layout would measure every label first, half the drawing time.
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=0.9 / width, right=1 - 0.2 / width, bottom=0.5 / height, top=0.93)
    fig.subplots_adjust(hspace=0.15)
    samples = timeline.samples
    if not samples:
        ax = fig.add_subplot()
        ax.set_axis_off()
        ax.text(0.5, 0.5, "Nothing recorded yet", ha="center", transform=ax.transAxes, color=INK)
        return fig
    seqs = numpy.fromiter((s.seq for s in samples), float, len(samples))
    x, xlabel, _ = x_axis(timeline.backward_calls, seqs)
    ax, ax2 = fig.subplots(2, 1, sharex=True)
    columns = int(width * dpi * 0.8)  # the plot area's width in pixels, about
    live = numpy.fromiter((s.live_nodes for s in samples), float, len(samples))
    retained = numpy.fromiter((s.retained_bytes for s in samples), float, len(samples))
    envelope = _series(ax, x, live, NODES_COLOR, columns)
    _series(ax2, x, retained, BYTES_COLOR, columns)
    ax.set_ylabel("live autograd\nnodes", color=NODES_COLOR, fontsize=8)
    ax2.set_ylabel("retained saved\ntensors", color=BYTES_COLOR, fontsize=8)
    ax2.yaxis.set_major_locator(MultipleLocator(byte_tick_step(int(retained.max()))))
    ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(int(v))))
    ax2.set_xlabel(xlabel, fontsize=8, color=INK)
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and events are counted
    for axis in (ax, ax2):
        axis.set_ylim(bottom=0)
        _neutral(axis)
    if envelope:
        ax.set_title(
            f"{len(samples):,} samples: the band spans the lowest to highest value "
            "within each pixel column",
            fontsize=7,
            color=INK,
            loc="left",
        )
    xs = dict(zip((s.seq for s in samples), x.tolist(), strict=True))
    labels = _mark_backward(ax, timeline.backward_calls, seqs, x)
    if not envelope:
        _mark_drops(ax, samples, xs)
    if timeline.error_line is not None:
        line = timeline.error_line
        for axis in (ax, ax2):
            axis.axvline(x[-1], color=ERROR_COLOR, ls="--", lw=1.2)
        labels.append((float(x[-1]), f"error L{line}", ERROR_COLOR))
    _place_vlabels(ax, labels)
    return fig


def _series(ax: Any, x: numpy.ndarray, y: numpy.ndarray, colour: str, columns: int) -> bool:
    """Draw `y` as steps, or as a min-max envelope per column when samples outnumber columns
    (a solid block of lines says nothing). True when an envelope was drawn."""
    if len(x) <= columns or x[-1] <= x[0]:
        ax.fill_between(x, y, step="post", color=colour, alpha=0.2, lw=0)
        ax.step(x, y, where="post", color=colour, lw=1.1)
        return False
    centres, low, high = envelope(x, y, columns)
    ax.fill_between(centres, low, step="mid", color=colour, alpha=0.15, lw=0)  # as the steps
    ax.fill_between(centres, low, high, step="mid", color=colour, alpha=0.35, lw=0)
    ax.step(centres, high, where="mid", color=colour, lw=0.9)
    ax.step(centres, low, where="mid", color=colour, lw=0.6, alpha=0.7)
    return True


def _neutral(ax: Any) -> None:
    """Axes in a mid grey that reads on light and dark backgrounds (the PNG is transparent)."""
    ax.tick_params(labelsize=7, colors=INK)
    for spine in ax.spines.values():
        spine.set_color(INK)
    ax.spines[["top", "right"]].set_visible(False)
    ax.patch.set_visible(False)


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


VLabel = tuple[float, str, str]  # x in data units, text, colour
_VLABEL_POINTS = 9.0  # the width of a 7-point label turned upright, with a little air


def _place_vlabels(ax: Any, labels: list[VLabel]) -> None:
    """Upright labels along the top of `ax`, each just right of its line. One that would touch
    the label before it moves right, and a run that would leave the plot at the right edge
    moves left of its lines instead; the same text at the same place is drawn once."""
    if not labels:
        return
    ax.get_xlim()  # settles the limits the positions below are computed from
    points = ax.figure.dpi / 72
    step = _VLABEL_POINTS * points
    line_px = [float(ax.transData.transform((x, 0))[0]) for x, _, _ in labels]
    order = sorted(range(len(labels)), key=lambda i: line_px[i])
    kept: list[int] = []
    for i in order:
        if kept and labels[kept[-1]][1] == labels[i][1] and line_px[i] - line_px[kept[-1]] < step:
            continue  # the same label again, on the same spot
        kept.append(i)
    left: list[float] = []
    for i in kept:
        at = line_px[i] + 2 * points
        left.append(at if not left else max(at, left[-1] + step))
    right_edge = ax.bbox.x1 - step
    for k in range(len(left) - 1, -1, -1):
        limit = right_edge if k == len(left) - 1 else left[k + 1] - step
        left[k] = min(left[k], limit)
    for i, at in zip(kept, left, strict=True):
        x, text, colour = labels[i]
        ax.annotate(
            text,
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=((at - line_px[i]) / points, -2),
            textcoords="offset points",
            rotation=90,
            va="top",
            fontsize=7,
            color=colour,
        )


def _mark_backward(
    ax: Any, calls: list[BackwardCall], seqs: numpy.ndarray, x: numpy.ndarray
) -> list[VLabel]:
    """Shade each backward call when there are few (a step axis already shows many); their
    labels, at most 12, first occurrence of each line first."""
    labels: list[VLabel] = []
    if len(calls) > 30:
        return labels
    seen: set[int] = set()
    labelled = 0
    for call in calls:
        end = call.end_seq if call.end_seq is not None else call.seq
        first, last = numpy.interp([call.seq, end], seqs, x)
        ax.axvspan(
            first,
            max(last, first + 0.004 * (x[-1] - x[0] or 1)),
            color=BACKWARD_COLOR,
            alpha=0.18,
            lw=0,
        )
        line = call.site.outer_line or call.line
        if labelled < 12 and (line not in seen or len(calls) <= 12):
            labels.append((float(first), f"backward L{line}", BACKWARD_COLOR))
            labelled += 1
        seen.add(line)
    return labels


def _mark_drops(ax: Any, samples: list, xs: dict[int, float]) -> None:
    """Mark the largest fall in live nodes (a graph being freed) on each of at most four lines."""
    peak = max(s.live_nodes for s in samples) or 1
    biggest: dict[int, tuple[int, int, int]] = {}
    for before, after in itertools.pairwise(samples):
        fall = before.live_nodes - after.live_nodes
        if fall >= max(1, 0.1 * peak) and fall > biggest.get(after.line, (0,))[0]:
            biggest[after.line] = (fall, after.seq, after.live_nodes)
    for line, (_, seq, live) in sorted(biggest.items(), key=lambda kv: -kv[1][0])[:4]:
        ax.plot([xs[seq]], [live], marker="v", color=NODES_COLOR, ms=6)
        ax.annotate(
            f"freed L{line}",
            (xs[seq], live),
            xytext=(3, 6),
            textcoords="offset points",
            fontsize=7,
            color=NODES_COLOR,
        )


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes on a transparent background: its grey text and mid-tone colours
    read on JupyterLab's light and dark themes alike."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, transparent=True)
    return buffer.getvalue()
