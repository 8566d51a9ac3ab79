"""The recorder's records: nodes, saved buffers, counters, timeline and backward calls.

Lines are checked against marker comments (`# L:name`) in this file, found by `line_of`.
"""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F
from markers import marker_lines
from torch import nn

import autograd_magic as am

line_of = marker_lines(__file__)


def names(trace: am.Trace) -> list[str]:
    return [n.name for n in trace.nodes]


# ----- nodes ----------------------------------------------------------------------------------


def test_each_node_is_recorded_with_its_name_and_birth_line(gc_disabled):
    """GIVEN two ops on a leaf WHEN tracked THEN each node has its name and the line of its op."""
    x = torch.randn(3, 4, requires_grad=True)
    with am.track() as trace:
        y = x.exp()  # L:exp
        z = (y * 2).sum()  # L:sum

    by_name = {n.name: n for n in trace.nodes}
    assert sorted(by_name) == ["AccumulateGrad", "ExpBackward0", "MulBackward0", "SumBackward0"]
    assert by_name["ExpBackward0"].born_line == line_of("exp")
    assert by_name["MulBackward0"].born_line == line_of("sum")
    assert by_name["SumBackward0"].born_line == line_of("sum")
    assert all(n.alive and n.freed_line is None for n in trace.nodes)
    assert trace.snapshot().live_nodes == 4
    assert trace.snapshot().nodes_created == 4
    del y, z


def test_library_modules_show_their_inner_nodes(gc_disabled):
    """GIVEN nn.Linear WHEN called tracked THEN its AddmmBackward0 and TBackward0 are recorded."""
    layer = nn.Linear(4, 2)
    x = torch.randn(5, 4)
    with am.track() as trace:
        out = layer(x)  # L:linear
    assert {"AddmmBackward0", "TBackward0"} <= set(names(trace))
    assert {n.born_line for n in trace.nodes} == {line_of("linear")}
    assert out.grad_fn.name() == "AddmmBackward0"


class _TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h.tanh()  # L:forward-tanh


def test_a_user_modules_forward_gives_the_inner_and_outer_lines(gc_disabled):
    """GIVEN a user nn.Module WHEN its forward runs tracked THEN nodes carry the line in forward
    and the line of the test that called the model."""
    model = _TwoLayer()
    with am.track() as trace:
        out = model(torch.randn(2, 3))  # L:call-model
    tanh = next(n for n in trace.nodes if n.name == "TanhBackward0")
    assert tanh.born_site.line == line_of("forward-tanh")
    assert tanh.born_site.function == "forward"
    assert tanh.born_site.outer_line == line_of("call-model")
    assert tanh.born_site.describe() == (
        f"line {line_of('forward-tanh')} in forward, called at line {line_of('call-model')}"
    )
    del out


def test_rebinding_frees_the_previous_graph_at_that_line(gc_disabled):
    """GIVEN a loop rebinding `out` WHEN the next sample's graph is bound THEN the previous
    sample's nodes die at that line, and the last graph dies at `del`."""
    x = torch.randn(8, requires_grad=True)
    with am.track() as trace:
        for i in range(3):
            out = (x * float(i)).exp().sum()  # L:rebind
        del out  # L:del
    graphs = [n for n in trace.nodes if n.name != "AccumulateGrad"]
    assert len(graphs) == 9
    assert [n.freed_line for n in graphs[:6]] == [line_of("rebind")] * 6
    assert [n.freed_line for n in graphs[6:]] == [line_of("del")] * 3
    assert all(
        later.born_seq < earlier.freed_seq
        for earlier, later in zip(graphs[:6], graphs[3:], strict=True)
    )


def test_a_finished_block_keeps_its_end_state_when_its_graph_dies_later(gc_disabled):
    """GIVEN a graph still alive when the block ends WHEN the user drops it later (the next cell)
    THEN the trace still shows the block's end state: nothing it says changes afterwards."""
    x = torch.randn(3, requires_grad=True)
    with am.track() as trace:
        y = x.sin()
    assert trace.nodes[0].alive and trace.snapshot().live_nodes == 2
    timeline = list(trace.timeline)
    del y
    assert trace.snapshot().live_nodes == 2
    assert [n.freed_line for n in trace.nodes] == [None, None]
    assert trace.timeline == timeline


# ----- saved buffers --------------------------------------------------------------------------


def test_saved_buffers_have_shape_dtype_bytes_and_leafness(gc_disabled):
    """GIVEN exp (saves its output) and mul by a leaf WHEN tracked THEN each saved tensor is a
    buffer with its owner, shape, dtype, bytes and whether it is a leaf."""
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(3, 4, dtype=torch.float32, requires_grad=True)
    with am.track() as trace:
        y = x.exp()  # L:buf-exp
        z = y * w  # L:buf-mul
    exp = next(n for n in trace.nodes if n.name == "ExpBackward0")
    mul = next(n for n in trace.nodes if n.name == "MulBackward0")
    (exp_buf,) = trace.buffers_of(exp.id)
    assert (exp_buf.shape, exp_buf.dtype, exp_buf.device) == ((3, 4), "float32", "cpu")
    assert exp_buf.nbytes == 48 and not exp_buf.is_leaf and exp_buf.saved_line == line_of("buf-exp")
    mul_bufs = sorted(trace.buffers_of(mul.id), key=lambda b: b.is_leaf)
    assert [b.is_leaf for b in mul_bufs] == [False, True]
    assert all(b.saved_line == line_of("buf-mul") for b in mul_bufs)
    assert not any(b.freed for b in trace.buffers)
    del z, y


def test_backward_releases_buffers_at_its_line_and_retain_graph_keeps_them(gc_disabled):
    """GIVEN a graph WHEN backward runs with retain_graph THEN buffers stay; WHEN it runs again
    without THEN every buffer is released at that backward's line."""
    x = torch.randn(5, requires_grad=True)
    with am.track() as trace:
        loss = (x.exp() * x.sin()).sum()
        loss.backward(retain_graph=True)  # L:retain
        kept = [b.freed for b in trace.buffers]
        loss.backward()  # L:release
    assert kept and not any(kept)
    assert all(b.freed and b.freed_line == line_of("release") for b in trace.buffers)
    retain, release = trace.backward_calls
    assert (retain.line, retain.retain_graph, retain.released_buffers) == (
        line_of("retain"),
        True,
        0,
    )
    assert release.released_buffers == len(trace.buffers)
    # what it freed is exactly what was retained (unique non-leaf storages): exp and sin outputs
    assert release.released_bytes == trace.peak_retained_bytes == 2 * 5 * 4
    assert trace.snapshot().retained_bytes == 0


def test_retained_bytes_count_what_only_the_graph_holds(gc_disabled):
    """GIVEN an MLP step whose loss is kept WHEN the block ends THEN retained bytes are the saved
    storages only the graph holds: the ReLU output, and the model output once the code drops
    `out`; never the input, the target or parameters, whose holders outlive the graph."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    x, target = torch.randn(32, 8), torch.randn(32, 1)
    relu_out, model_out = 32 * 16 * 4, 32 * 1 * 4
    with am.track() as trace:
        out = model(x)
        loss = F.mse_loss(out, target)
    assert trace.retained_bytes == trace.peak_retained_bytes == relu_out
    held_by = sorted((b.shape, b.held_by) for b in trace.buffers)
    assert held_by == [
        ((16, 1), "parameter"),  # fc2.weight.t(): a view of a parameter
        ((32, 1), "user tensor"),  # out
        ((32, 1), "user tensor"),  # target
        ((32, 8), "user tensor"),  # x
        ((32, 16), ""),  # the ReLU's output: only the graph holds it
        ((32, 16), ""),
    ]
    with am.track() as trace:
        loss = F.mse_loss(model(x), target)
    assert trace.retained_bytes == relu_out + model_out
    del loss


def test_backward_frees_what_only_the_graph_held(gc_disabled):
    """GIVEN a step WHEN backward runs THEN the call frees the storages only the graph held,
    counted when it starts (the output the code still holds is not among them)."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    x, target = torch.randn(32, 8), torch.randn(32, 1)
    with am.track() as trace:
        out = model(x)
        loss = F.mse_loss(out, target)
        loss.backward()
    (call,) = trace.backward_calls
    assert call.released_bytes == trace.peak_retained_bytes == 32 * 16 * 4
    assert trace.retained_bytes == 0


def test_views_of_one_storage_are_counted_once(gc_disabled):
    """GIVEN two saved slices of one intermediate WHEN tracked THEN its storage counts once."""
    x = torch.randn(10, requires_grad=True)
    with am.track() as trace:
        h = x.exp()
        y = (h[:5] * h[5:]).sum()
        assert trace.snapshot().retained_bytes == 0  # `h` still holds that storage
        del h
        assert trace.snapshot().retained_bytes == 40  # h's storage; h[:5], h[5:] share it
        del y
        assert trace.snapshot().retained_bytes == 0


# ----- counters and timeline --------------------------------------------------------------------


def test_peaks_survive_the_graphs_death(gc_disabled):
    """GIVEN a graph that is built then freed THEN live counters return to zero and peaks stay."""
    x = torch.randn(4, requires_grad=True)
    with am.track() as trace:
        loss = x.exp().exp().sum()
        loss.backward()
        del loss
    s = trace.snapshot()
    assert s.live_nodes == 0 and s.retained_bytes == 0
    assert s.peak_live_nodes == 4 and s.peak_retained_bytes == 32
    assert s.nodes_created == 4 and s.buffers_saved == 2


def test_timeline_shows_growth_and_the_backward_release(gc_disabled):
    """GIVEN forward then backward WHEN reading the timeline THEN retained bytes rise on the
    forward lines and fall to zero at the backward line, which is marked."""
    x = torch.randn(4, requires_grad=True)
    with am.track() as trace:
        a = x.exp()  # L:tl-exp
        loss = a.tanh().sum()  # L:tl-tanh
        loss.backward()  # L:tl-bwd
    lines = [s.line for s in trace.timeline]
    assert lines.index(line_of("tl-exp")) < lines.index(line_of("tl-tanh"))
    peak = max(s.retained_bytes for s in trace.timeline)
    # exp and tanh each save a 16-byte output; the code holds exp's (`a`): only tanh's counts
    assert peak == 16
    marks = [s for s in trace.timeline if s.line == line_of("tl-bwd")]
    assert marks[0].what == "backward start" and marks[-1].what == "backward"
    assert marks[0].retained_bytes == 16 and marks[-1].retained_bytes == 0
    seqs = [s.seq for s in trace.timeline]
    assert seqs == sorted(seqs)


# ----- backward calls -------------------------------------------------------------------------


def test_backward_and_grad_calls_record_their_options(gc_disabled):
    """GIVEN backward, grad with create_graph, and grad with retain_graph=False
    THEN each call records its kind, line and graph options."""
    x = torch.randn(3, requires_grad=True)
    with am.track() as trace:
        y = (x**3).sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)  # L:grad-create
        g.sum().backward(retain_graph=False)  # L:bwd-second
    first, second = trace.backward_calls
    assert (first.kind, first.line, first.create_graph, first.retain_graph) == (
        "grad",
        line_of("grad-create"),
        True,
        True,
    )
    assert (second.kind, second.line, second.create_graph, second.retain_graph) == (
        "backward",
        line_of("bwd-second"),
        False,
        False,
    )
    assert first.error is None and second.error is None
    assert torch.equal(x.grad, 6 * x.detach())


def test_a_failing_backward_is_recorded_then_reraised_unchanged(gc_disabled):
    """GIVEN a second backward through a freed graph WHEN tracked THEN PyTorch's own error
    reaches the user unchanged and the call records it."""
    x = torch.randn(3, requires_grad=True)
    loss = (x * x).sum()
    loss.backward()
    with pytest.raises(RuntimeError) as untracked:
        loss.backward()
    loss = (x * x).sum()
    with am.track() as trace:
        loss.backward()
        with pytest.raises(RuntimeError) as tracked:
            loss.backward()  # L:bwd-fail
    assert str(tracked.value) == str(untracked.value)
    call = trace.backward_calls[-1]
    assert call.line == line_of("bwd-fail")
    assert call.error == str(untracked.value) and call.error_type == "RuntimeError"
    assert trace.error is None  # caught inside the block


# ----- scale ----------------------------------------------------------------------------------


def test_caps_bound_the_records_while_counters_stay_exact(gc_disabled):
    """GIVEN a 50,000-op block with small caps WHEN it runs THEN the records stop at the caps,
    the counters are exact, and the trace counts what it dropped (the report says so)."""
    n = 25_000
    x = torch.randn(4, requires_grad=True)
    trace = am.Trace(max_records=1_000, max_timeline=200)
    with am.track(trace=trace):
        for _ in range(n):
            out = x.exp().sum()  # two nodes and one saved buffer per iteration
        del out
    s = trace.snapshot()
    assert s.nodes_created == 2 * n + 1  # + x's AccumulateGrad, kept alive across iterations
    assert s.buffers_saved == n
    assert s.live_nodes == 0 and s.retained_bytes == 0
    assert s.peak_retained_bytes == 32  # the next graph is built before `out` lets the last go
    assert len(trace.nodes) == 1_000 and trace.dropped_nodes == s.nodes_created - 1_000
    assert len(trace.buffers) == 1_000 and trace.dropped_buffers == n - 1_000
    assert len(trace.timeline) <= 200


def test_many_backward_calls_stay_within_the_caps_at_constant_cost(gc_disabled):
    """GIVEN 3,000 backward calls in one block with small caps WHEN it runs THEN the calls and the
    timeline stop at their caps (backward markers thinned too, so thinning stays rare) and the
    drops are counted."""
    x = torch.randn(4, requires_grad=True)
    trace = am.Trace(max_records=500, max_timeline=200)
    with am.track(trace=trace):
        for _ in range(3_000):
            (x * 2).sum().backward()
    assert len(trace.backward_calls) == 500
    assert trace.dropped_events == 2_500
    assert len(trace.timeline) <= 200
    assert trace.timeline[-1].what == "backward"  # the newest state is always there


@pytest.mark.parametrize("kind", ["ops", "detach", "views", "inplace", "fresh", "backward"])
def test_a_long_block_of_each_kind_stays_within_the_caps(kind, gc_disabled):
    """GIVEN 10,000 events of one kind (ops, x.detach(), base[1:], in-place writes on one tensor
    or on a fresh tensor each time, backward calls) with caps of 500 WHEN recorded THEN every
    per-event structure stays bounded (records, names, timeline, and the recorder's own
    per-object state), and the counters are exact."""
    x, base, w = torch.ones(4, requires_grad=True), torch.ones(8), torch.zeros(4)
    trace = am.Trace(max_records=500, max_timeline=200)
    recorder = am.track(trace=trace)
    kept = None  # each new result replaces the last, as a loop variable does
    with recorder:
        for _ in range(10_000):
            if kind == "ops":
                kept = x * 2
            elif kind == "detach":
                kept = x.detach()
            elif kind == "views":
                kept = base[1:]
            elif kind == "inplace":
                w.add_(1)
            elif kind == "fresh":
                kept = torch.zeros(4)
                kept.add_(1)
            else:
                (x * 2).sum().backward()
        aliases = recorder.aliases
        registry = aliases.registry
        per_object = (len(registry.op_labels), len(aliases._shared_with), registry.dead_count())
    del kept
    for records in (trace.nodes, trace.buffers, trace.links, trace.version_bumps):
        assert len(records) <= 500
    assert len(trace.backward_calls) <= 500 and len(trace.labels) <= 500
    assert len(trace.timeline) <= 200
    assert max(per_object) < 4_096 + 10  # dead objects' state is dropped in batches of 4,096
    if kind in ("detach", "views"):
        assert len(trace.links) == 500 and trace.dropped_events == 10_000 - 500
    if kind == "inplace":
        assert w[0].item() == 10_000 and trace.dropped_events == 10_000 - 500


def test_records_hold_no_tensor(gc_disabled):
    """GIVEN a finished trace THEN a tensor it recorded dies as soon as the user drops it."""
    x = torch.randn(3, requires_grad=True)
    with am.track() as trace:
        y = x.exp()
    ref = weakref.ref(y)
    del y
    assert ref() is None
    assert not trace.buffers[0].freed  # released after the block: not the block's event


def test_names_the_caller_says_to_ignore_are_not_walked(gc_disabled):
    """GIVEN a namespace where a notebook's own table (`Out`) holds a view before the user's
    name does WHEN the block is told to ignore `Out` THEN the view is named by the user's path,
    and without the option by the table's."""
    x = torch.randn(4, requires_grad=True)

    def record(ignore: tuple[str, ...]) -> set[str]:
        namespace: dict = {}
        with am.track(namespace=namespace, ignore_names=ignore) as trace:
            view = x.detach()
            namespace.update(Out={1: view}, held=[[view]])
        return set(trace.labels.values())

    assert "Out[1]" in record(())
    names = record(("Out",))
    assert "held[0][0]" in names and not any(n.startswith("Out") for n in names)
