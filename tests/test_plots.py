"""Timeline and graph figures: layout, colours, collapsing, labels, no pyplot state, speed."""

from __future__ import annotations

import base64
import inspect
import io
import itertools
import re
import time

import numpy
import pytest
import torch
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from traces import handmade_trace, report

import autograd_magic
from autograd_magic.analysis import layout
from autograd_magic.views import figures as plots
from autograd_magic.views import html as static


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def recorded_loops(iterations: int) -> autograd_magic.Trace:
    """A real trace: each iteration builds 5 x (mul, relu) and a sum; all summed at the end."""
    w = torch.rand(8, requires_grad=True)
    outs = []
    with autograd_magic.track(namespace={}) as trace:
        for _ in range(iterations):
            h = w
            for _ in range(5):
                h = (h * 1.01).relu()
            outs.append(h.sum())
        sum(outs)
    return trace


def test_layers_put_leaves_at_the_top_and_the_loss_at_the_bottom():
    view = layout.graph_view(handmade_trace())
    by_name = {box.name: box for box in view.boxes}
    assert by_name["AccumulateGrad"].layer == 0
    assert by_name["MulBackward0"].layer == 1
    assert by_name["SumBackward0"].layer == 3
    assert view.note == ""
    assert len(view.edges) == 3
    fig = plots.graph_figure(view)
    points = fig.axes[0].collections[0].get_offsets()
    ys = {box.name: -y for box, (_, y) in zip(view.boxes, points, strict=True)}
    assert ys["AccumulateGrad"] < ys["SumBackward0"]  # drawn above


def test_colours_say_alive_freed_and_leaf():
    view = layout.graph_view(handmade_trace())
    fig = plots.graph_figure(view)
    colours = [to_hex(c) for c in fig.axes[0].collections[0].get_facecolors()]
    expected = {
        "AccumulateGrad": plots.LEAF,
        "MulBackward0": plots.RELEASED,  # alive, but it saved nothing: it holds no memory
        "ExpBackward0": plots.FREED,
        "SumBackward0": plots.ALIVE,
    }
    assert colours == [expected[box.name] for box in view.boxes]
    labels = texts(fig)
    assert "Sum L4\n4.0 KiB" in labels
    assert "leaf L2" in labels


def test_selected_box_is_ringed():
    view = layout.graph_view(handmade_trace())
    plain = plots.graph_figure(view)
    ringed = plots.graph_figure(view, selected=2)
    assert len(ringed.axes[0].collections) == len(plain.axes[0].collections) + 1


def test_repeated_structure_is_merged_with_a_note_and_nothing_is_cut():
    trace = recorded_loops(60)
    view = layout.graph_view(trace, max_nodes=40)
    assert len(view.boxes) <= 40
    assert sum(len(box.members) for box in view.boxes) == len(trace.nodes)
    assert view.note.startswith(f"{len(trace.nodes):,} nodes shown as {len(view.boxes)} boxes")
    # (in plain words, one sentence: issue 36, item 7)
    assert "repeated nodes share a box marked xN (N nodes of one type, made on one" in view.note
    assert view.note.count(":") == 1 and view.note.endswith(")."), view.note
    assert any(box.label.startswith("MulBackward0 x60") for box in view.boxes)


def test_coarsest_collapse_keeps_every_node_in_some_box():
    trace = recorded_loops(10)
    view = layout.graph_view(trace, max_nodes=2)
    assert len(view.boxes) == 2
    assert sum(len(box.members) for box in view.boxes) == len(trace.nodes)
    assert "'other lines' box" in view.note


def test_under_the_cap_every_node_is_its_own_box():
    trace = recorded_loops(3)
    view = layout.graph_view(trace, max_nodes=1000)
    assert len(view.boxes) == len(trace.nodes)
    assert view.note == ""


def test_timeline_marks_backward_drops_and_error_with_lines():
    trace = handmade_trace(error=True)
    trace.timeline.append(trace.timeline[-1]._replace(seq=10, live_nodes=0, line=8))
    fig = plots.timeline_figure(report(trace).timeline)
    labels = texts(fig)
    assert "backward L5" in labels
    assert "freed L8" in labels
    assert "error L7" in labels
    assert fig.axes[1].get_ylabel() == "retained saved\ntensors"


def test_empty_trace_figures_say_so():
    timeline = report(autograd_magic.Trace()).timeline
    assert "Nothing recorded yet" in texts(plots.timeline_figure(timeline))
    empty = plots.graph_figure(layout.graph_view(autograd_magic.Trace()))
    assert "No autograd nodes recorded" in texts(empty)


def test_no_pyplot_state_and_png_helpers():
    assert "import matplotlib.pyplot" not in inspect.getsource(plots)
    assert "from matplotlib import pyplot" not in inspect.getsource(plots)
    pyplot = pytest.importorskip("matplotlib.pyplot")
    png = plots.figure_png(plots.timeline_figure(report(handmade_trace()).timeline))
    png += plots.figure_png(plots.graph_figure(layout.graph_view(handmade_trace())))
    assert pyplot.get_fignums() == []
    assert png.startswith(b"\x89PNG")
    tag = static.png_img_html(b"\x89PNG", 'a "graph"')
    assert tag.startswith('<img alt="a &quot;graph&quot;"')
    assert "data:image/png;base64,iVBORw==" in tag


def test_static_pngs_are_compacted_to_a_palette_of_the_same_size():
    # GIVEN a rendered timeline WHEN compacted for a saved notebook output
    from PIL import Image

    png = plots.figure_png(plots.timeline_figure(report(handmade_trace()).timeline))
    small = static.compact_png(png)
    # THEN it is well under the original, decodes, and keeps the picture's dimensions
    assert len(small) < 0.7 * len(png), (len(small), len(png))
    assert Image.open(io.BytesIO(small)).size == Image.open(io.BytesIO(png)).size
    # AND the <img> tag embeds the compact version
    assert base64.b64encode(small).decode() in static.png_img_html(png, "timeline")


def test_byte_ticks_fall_on_whole_binary_units():
    # GIVEN peaks of 8.2 KiB, 300 B and 3 GiB WHEN the bytes axis is ticked
    # THEN ticks are 2 KiB, 50 B and 1 GiB apart, never 1000 B next to 2.0 KiB
    assert plots.byte_tick_step(8400) == 2048
    assert plots.byte_tick_step(300) == 50
    assert plots.byte_tick_step(3 * 1024**3) == 1024**3
    assert plots.byte_tick_step(0) == 1


def test_ten_thousand_node_graph_renders_quickly():
    """Linear-time layout: a quadratic step would take minutes here, not seconds."""
    trace = recorded_loops(1000)
    assert len(trace.nodes) > 10_000
    start = time.perf_counter()
    view = layout.graph_view(trace, max_nodes=20_000)
    plots.figure_png(plots.graph_figure(view))
    elapsed = time.perf_counter() - start
    assert len(view.boxes) == len(trace.nodes)
    assert elapsed < 10.0  # ~1.5-2 s measured on a shared 2-core machine


def _per_sample_losses(samples: int) -> autograd_magic.Trace:
    """Forward every sample, keep every loss: one MseLoss box per sample on the same layer."""
    model = torch.nn.Linear(4, 1)
    with autograd_magic.track(namespace={}) as trace:
        losses = [
            torch.nn.functional.mse_loss(model(torch.randn(1, 4)), torch.zeros(1, 1))
            for _ in range(samples)
        ]
        sum(losses).backward()
    return trace


def collisions(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of texts (labels, title, legend) whose drawn extents overlap, and texts drawn over
    a dot or past the figure's edge."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    ax = fig.axes[0]
    drawn = [*ax.texts, ax.title, *(t for legend in fig.legends for t in legend.get_texts())]
    extents = [(t.get_text(), t.get_window_extent(renderer)) for t in drawn if t.get_text()]
    found = [
        (a, b)
        for i, (a, box) in enumerate(extents)
        for b, other in extents[:i]
        if box.overlaps(other)
    ]
    dots = ax.collections[0]
    centres = ax.transData.transform(dots.get_offsets())
    radii = numpy.sqrt(dots.get_sizes()) / 2 * fig.dpi / 72
    for text, box in extents:
        if box.x0 < 0 or box.x1 > fig.bbox.width:
            found.append((text, "the figure's edge"))
        for (x, y), r in zip(centres, radii, strict=True):
            if box.x0 < x + r and x - r < box.x1 and box.y0 < y + r and y - r < box.y1:
                found.append((text, "a dot"))
                break
    return found


def test_alike_boxes_in_a_row_share_one_label_and_no_text_overlaps():
    """GIVEN 32 per-sample losses on one layer of the graph view (their labels overprinted one
    another) WHEN drawn THEN the row has one label counting them, and no text runs into another
    text, a dot or the figure's edge."""
    view = layout.graph_view(_per_sample_losses(32), max_nodes=400, depth=0)  # one box per op
    fig = plots.graph_figure(view)
    assert collisions(fig) == []
    assert any(re.match(r"MseLoss L\d+, 32 alike in this row", t) for t in texts(fig))


def test_labels_that_do_not_fit_are_counted_above_the_drawing():
    """GIVEN 30 different ops on one layer (no row label can stand for them) WHEN drawn THEN the
    labels that would overlap are left out, the title counts them, and nothing overlaps."""
    w = torch.rand(4, requires_grad=True)
    names = ["sin", "cos", "exp", "tanh", "sigmoid", "abs", "neg", "log1p", "sqrt", "square"]
    with autograd_magic.track(namespace={}) as trace:
        kept = [getattr(w * k, name)() for k in range(3) for name in names]
    fig = plots.graph_figure(layout.graph_view(trace, max_nodes=400, depth=0))
    assert collisions(fig) == []
    assert "labels left out where they would overlap" in fig.axes[0].get_title()
    del kept


def test_timeline_ticks_count_whole_events():
    """GIVEN a timeline of about a dozen events (its default ticks were 2.5, 7.5, ...) WHEN drawn
    THEN every tick is a whole event."""
    trace = handmade_trace()
    last = trace.timeline[-1]
    trace.timeline += [last._replace(seq=last.seq + 1 + k) for k in range(9)]
    fig = plots.timeline_figure(report(trace).timeline)
    ticks = fig.axes[1].get_xticks()
    assert all(float(t).is_integer() for t in ticks), ticks


def test_the_variable_that_keeps_a_graph_alive_is_drawn_with_it():
    """GIVEN a loop that keeps every loss in `history` WHEN the graph is drawn THEN the box of the
    losses says it is held by `history[...]` (the answer to "who keeps this alive?")."""
    w = torch.rand(8, requires_grad=True)
    namespace: dict = {}
    with autograd_magic.track(namespace=namespace) as trace:
        history = namespace["history"] = []
        for _ in range(5):
            history.append((w * 2).sum())
    labels = texts(plots.graph_figure(layout.graph_view(trace)))
    held = [label.split("held by ")[1] for label in labels if "held by " in label]
    # (one box per loss, too many to label each: the row's label names the list once)
    assert held == ["history (5 entries)"], labels


def test_a_graph_kept_after_backward_is_drawn_alive_with_its_saved_tensors_released():
    """GIVEN losses kept in a list after backward freed their saved tensors WHEN drawn THEN their
    boxes have the 'alive, saved tensors released' colour, named in the legend."""
    w = torch.rand(8, requires_grad=True)
    namespace: dict = {}
    with autograd_magic.track(namespace=namespace) as trace:
        history = namespace["history"] = []
        for _ in range(3):
            loss = (w.exp() * 2).sum()
            loss.backward()
            history.append(loss)
    view = layout.graph_view(trace)
    fig = plots.graph_figure(view)
    colours = [to_hex(c) for c in fig.axes[0].collections[0].get_facecolors()]
    exp_boxes = [i for i, box in enumerate(view.boxes) if box.name == "ExpBackward0"]
    assert exp_boxes and all(colours[i] == plots.RELEASED for i in exp_boxes)
    legend = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "alive, holds none (released or never saved)" in legend


def _labels_of(fig: Figure) -> list:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return [
        (t.get_text(), t.get_window_extent(renderer))
        for ax in fig.axes
        for t in ax.texts
        if t.get_text()
    ]


def test_the_timeline_labels_of_a_cell_that_raises_neither_overlap_nor_leave_the_picture():
    # GIVEN a block whose last events are a graph freed, a backward and the error, all at the end
    with pytest.raises(RuntimeError), autograd_magic.track() as trace:
        x = torch.ones(3, requires_grad=True)
        for _ in range(60):
            loss = (x * 2).exp().sum()  # each rebinding frees the last graph
        for _ in range(2):
            loss.backward()  # the second raises on this line: the first freed the graph
    # WHEN the finished timeline is drawn
    fig = plots.timeline_figure(report(trace).timeline)
    labels = _labels_of(fig)
    texts = [text for text, _ in labels]
    # THEN its labels (issue 36, item 5: "freed L9", "backward L11", "error L11") are all there,
    assert any(t.startswith("error L") for t in texts) and any("backward L" in t for t in texts)
    # inside the picture, and no two of them overlap
    width, height = fig.bbox.width, fig.bbox.height
    for text, box in labels:
        assert box.x0 >= 0 and box.x1 <= width and box.y0 >= 0 and box.y1 <= height, text
    for (a, box_a), (b, box_b) in itertools.combinations(labels, 2):
        assert not box_a.overlaps(box_b), (a, b)


def test_every_box_of_a_two_headed_script_is_labelled_inside_the_picture():
    # GIVEN a trunk with two heads, the second head's graph freed by its backward (a script's
    # block: its boxes lie at the right edge, where a label right of its dot has no room)
    torch.manual_seed(0)
    trunk = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh())
    heads = torch.nn.Linear(16, 1), torch.nn.Linear(16, 1)
    with autograd_magic.track() as trace:
        features = trunk(torch.randn(4, 8))
        first = heads[0](features).sigmoid().mean()
        heads[1](features).sigmoid().mean().backward(retain_graph=True)
    view = report(trace).graph.view
    assert any(not box.alive for box in view.boxes)
    # WHEN its graph is drawn
    fig = plots.graph_figure(view)
    labels = _labels_of(fig)
    # THEN every box has its own label (issue 36, item 4: the freed head had none), left of
    # its dot where the right has no room, inside the picture and over no other label
    assert len(labels) == len(view.boxes), [text for text, _ in labels]
    assert "labels left out" not in fig.axes[0].get_title()
    for text, box in labels:
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width, text
    for (a, box_a), (b, box_b) in itertools.combinations(labels, 2):
        assert not box_a.overlaps(box_b), (a, b)
    assert any(t.startswith("1 node") or "\n1 node" in t for t, _ in labels)  # not "1 nodes"
    del first
