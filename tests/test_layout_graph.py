"""The graph view of models: one labelled box per module at a depth, parameters inside the box
that uses them, repeated layers merged over the budget, leaves beside their user."""

from __future__ import annotations

import torch
from torch import nn
from traces import handmade_trace, module_trace, report

import autograd_magic
from autograd_magic.analysis import layout
from autograd_magic.analysis.grouping import READABLE_BOXES
from autograd_magic.report.model import SectionId
from autograd_magic.views import figures
from autograd_magic.views.panel import TABS, TracePanel
from autograd_magic.views.text import render_text


def names(view: layout.GraphView) -> list[str]:
    return [box.name for box in view.boxes]


def test_one_box_per_module_at_each_depth_with_parameters_inside():
    trace = module_trace(layers=12)
    # WHEN drawn at depth 1 THEN one box per block, the loss as itself, no leaf of its own
    top = layout.graph_view(trace, depth=1)
    assert names(top) == [f"layers.{i}" for i in range(12)] + ["SumBackward0"]
    block = top.boxes[0]
    assert block.label == "layers.0 Block (7 nodes)"
    assert (block.params, block.saved_bytes, block.leaf) == (2, 2048, False)
    assert top.depth == 1 and top.max_depth == 2
    assert "one box per module at depth 1 of 2 (parameters inside" in top.note
    # AND at depth 2 the children are boxes and each block's own Add is an op
    inner = layout.graph_view(trace, depth=2)
    assert names(inner)[:3] == ["layers.0.attn", "layers.0.mlp", "AddBackward0"]
    assert len(inner.boxes) == 12 * 3 + 1
    assert inner.boxes[0].label == "layers.0.attn Attention (3 nodes)"
    # AND every op shows every node, leaves included
    ops = layout.graph_view(trace, depth=layout.OPS)
    assert len(ops.boxes) == len(trace.nodes) and ops.depth == layout.OPS
    # AND every node is in exactly one box at every depth
    for view in (top, inner, ops):
        assert sorted(m for box in view.boxes for m in box.members) == [n.id for n in trace.nodes]


def test_default_depth_is_the_deepest_that_stays_readable():
    assert layout.graph_view(module_trace(layers=12)).depth == 2  # 37 boxes
    assert layout.graph_view(module_trace(layers=14)).depth == 1  # 43 > 40 at depth 2


def test_a_blocks_own_ops_count_one_box_each_when_choosing_the_depth():
    # GIVEN 6 blocks with 6 own ops each, all on one line: 49 boxes at depth 2
    trace = module_trace(layers=6, own_ops=6)
    # THEN the default stays at depth 1 rather than merging ops of different blocks
    view = layout.graph_view(trace)
    assert view.depth == 1 and len(view.boxes) == 7
    assert len(layout.graph_view(trace, depth=2).boxes) == 49


def test_repeated_layers_merge_in_runs_when_over_the_budget():
    trace = module_trace(layers=12)
    view = layout.graph_view(trace, max_nodes=5, depth=1)
    assert names(view) == ["layers.0-3", "layers.4-7", "layers.8-11", "SumBackward0"]
    assert view.boxes[0].label == "layers.0-3 Block x4 (28 nodes)"
    assert "repeated layers merged (12 modules in 3 boxes)" in view.note
    assert sum(len(box.members) for box in view.boxes) == len(trace.nodes)


def test_every_op_puts_a_leaf_one_layer_above_its_user():
    view = layout.graph_view(module_trace(layers=3), depth=layout.OPS)
    at = {m: box for box in view.boxes for m in box.members}
    leaves = [box for box in view.boxes if box.name == "AccumulateGrad"]
    for box in leaves:
        user = at[box.members[0] + 1]  # the Mm right after it
        assert box.layer == user.layer - 1
    assert leaves[-1].layer > 10  # deep in the chain, not in a row of leaves at the top


def test_every_module_box_is_labelled_in_the_figure():
    view = layout.graph_view(module_trace(layers=12))
    texts = [t.get_text() for t in figures.graph_figure(view).axes[0].texts]
    assert len(texts) == len(view.boxes)
    assert "layers.0.attn  Attention\n3 nodes, 1.0 KiB" in texts
    assert "one box per module at depth 2" in figures.graph_figure(view).axes[0].get_title()


def test_a_twelve_layer_transformer_reads_as_twelve_labelled_layers():
    # GIVEN a real 12-layer TransformerEncoder training step
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
    x = torch.randn(2, 4, 16)
    with autograd_magic.track(namespace={}) as trace:
        model(x).pow(2).mean().backward()
    # WHEN its graph is drawn by default THEN it fits the readable budget, one box per layer
    view = layout.graph_view(trace)
    assert len(trace.nodes) > 500
    assert len(view.boxes) <= READABLE_BOXES
    layers = [b for b in view.boxes if b.type == "TransformerEncoderLayer"]
    assert [b.name for b in layers] == [f"layers.{i}" for i in range(12)]
    assert not any(b.leaf for b in view.boxes)  # parameters are inside their layer
    assert [b.layer for b in layers] == sorted(b.layer for b in layers)  # top to bottom


def test_panel_depth_control_redraws_the_graph():
    panel = TracePanel(module_trace(layers=12))
    panel.tabs.selected_index = TABS.index(SectionId.GRAPH)
    select = panel.depth_select
    assert [label for label, _ in select.options] == ["depth 1", "depth 2", "every op"]
    assert select.value == 2 and len(panel.node_select.options) == 37
    picture = panel.graph_image.value
    select.value = 1
    assert panel.view is not None and panel.view.depth == 1
    assert panel.node_select.options[0][0] == "layers.0 Block (7 nodes)"
    assert "depth 1 of 2" in panel.graph_note.value
    assert panel.graph_image.value != picture
    select.value = layout.OPS
    assert len(panel.node_select.options) == 12 * 7 + 1


def test_panel_without_modules_offers_every_op_only():
    panel = TracePanel(handmade_trace())
    panel.tabs.selected_index = TABS.index(SectionId.GRAPH)
    assert panel.depth_select.options == (("every op", layout.OPS),)
    assert panel.depth_select.disabled


def test_text_report_lists_the_default_graph_view():
    text = render_text(report(module_trace(layers=12)))
    assert "Graph (module depth 2 of 2)" in text
    rows = text[text.index("Graph (") :].splitlines()
    assert rows[2].split() == ["layers.0.attn", "Attention", "3", "1.0", "KiB", "1.0", "KiB"]
    assert "85 nodes shown as 37 boxes: one box per module at depth 2 of 2" in text
    assert "Showing the first 20 of 37 boxes." in text


def test_a_module_box_counts_the_bytes_the_modules_view_gives():
    # GIVEN a small MLP whose first layer saves only its input (the code's `x`, not retained)
    # and the others activations
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    x = torch.randn(4, 8)
    with autograd_magic.track() as trace:
        loss = net(x).pow(2).sum()
    # WHEN laid out one box per layer
    view = layout.graph_view(trace, depth=1)
    boxes = {b.module: b for b in view.boxes if b.module}
    # THEN each box's bytes are its module's saved bytes: activations, not inputs or weights
    stats = {m.path: m for m in trace.modules()}
    for path in ("net.0", "net.1", "net.2"):
        assert boxes[path].saved_bytes == stats[path].saved_bytes, path
    assert boxes["net.0"].saved_bytes == 0 and boxes["net.1"].saved_bytes == 4 * 16 * 4
    del loss
