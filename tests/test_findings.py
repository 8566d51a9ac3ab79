"""Findings: each kind fires on the classic mistake (naming the variable and line) and stays
silent on the correct version of the same code."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from markers import marker_lines

import autograd_magic as am
from autograd_magic.analysis.findings import KINDS, find_facts
from autograd_magic.model.records import (
    BackwardCall,
    Finding,
    Holder,
    NodeRecord,
    SavedBuffer,
    Site,
)
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import format_bytes
from autograd_magic.report.wording import finding

line_of = marker_lines(__file__)


def analyze(trace: Trace) -> list[Finding]:
    """The trace's findings, worded, computed here (not read from `trace.findings`)."""
    return [finding(f) for f in find_facts(trace)]


def kinds(trace: am.Trace) -> list[str]:
    return [f.kind for f in trace.findings]


def only(trace: am.Trace, kind: str) -> am.Finding:
    found = [f for f in trace.findings if f.kind == kind]
    assert len(found) == 1, trace.findings
    return found[0]


@pytest.fixture
def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def test_clean_training_loop_has_no_findings(model):
    # GIVEN zero_grad, forward, backward, step, logging loss.item()
    data, target = torch.randn(32, 8), torch.randn(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # WHEN it runs tracked
    with am.track() as trace:
        history = []
        for _ in range(4):
            opt.zero_grad()
            loss = F.mse_loss(model(data), target)
            loss.backward()
            opt.step()
            history.append(loss.item())
    # THEN nothing is reported
    assert trace.findings == []


def test_inference_under_no_grad_has_no_findings(model):
    with am.track() as trace:
        with torch.no_grad():
            for _ in range(3):
                out = model(torch.randn(4, 8))
        with torch.inference_mode():
            out = model(torch.randn(4, 8))
    assert out.shape == (4, 1)
    assert trace.findings == []


# ----- hand-made records: no recorder runs ------------------------------------------------
def _site(line: int) -> Site:
    return Site("<cell>", line)


def _backward(
    seq: int, reached: tuple[int, ...] = (), retain: bool = False, **fields
) -> BackwardCall:
    return BackwardCall("backward", seq, _site(6), retain, False, reached=reached, **fields)


def test_facts_from_handmade_records_name_a_running_total():
    """GIVEN records of `total_loss += loss` over two iterations (two AddBackward0 nodes built at
    line 5, each after a backward) WHEN analysed THEN one kept-alive fact names the holder, the
    line that built the chain, the iterations spanned and the nodes, and its wording says so."""
    nodes = [
        NodeRecord(1, "MseLossBackward0", 5, _site(3), reached_by=0),
        NodeRecord(2, "AddBackward0", 11, _site(5), next_ids=(1,)),
        NodeRecord(3, "MseLossBackward0", 15, _site(3), reached_by=1),
        NodeRecord(4, "AddBackward0", 21, _site(5), next_ids=(2, 3)),
    ]
    trace = am.Trace.from_records(
        nodes,
        backward_calls=[_backward(10), _backward(20)],
        holders=[Holder("total_loss", 4)],
        finished=True,
    )
    [fact] = find_facts(trace)
    assert (fact.kind, fact.form, fact.holder, fact.line) == (
        "kept-alive",
        "chain",
        "total_loss",
        5,
    )
    assert fact.built == _site(5) and fact.iterations == 2 and fact.node_ids == (1, 2, 3, 4)
    assert fact.cause is None
    [finding] = analyze(trace)
    assert finding.message.startswith(
        "`total_loss` keeps every iteration's graph alive: line 5 adds each new result to it, "
        "so 2 iterations' graphs (4 nodes) are chained together and never freed."
    )


def test_a_consequence_fact_links_to_its_root_cause():
    """GIVEN records of `h = tanh(h + x)` carried into a second iteration whose backward (with
    retain_graph=True) walked the first iteration's node WHEN analysed THEN graph-growth comes
    first and the retained-graph fact's cause is that very fact; the wording names `h`."""
    nodes = [
        NodeRecord(1, "TanhBackward0", 5, _site(4), reached_by=0),
        NodeRecord(2, "TanhBackward0", 15, _site(4), next_ids=(1,), reached_by=1),
        NodeRecord(3, "SumBackward0", 16, _site(5), next_ids=(2,), reached_by=1),
    ]
    buffers = [
        SavedBuffer(1, 1, (32, 32), "float32", "cpu", 4096, 4096, False, False, 0, 4, _site(4))
    ]
    calls = [
        _backward(10, (1,), retain=True),
        _backward(20, (3, 2, 1), retain=True, earlier_nodes=1, root_ids=(3,)),
    ]
    trace = am.Trace.from_records(
        nodes, buffers, backward_calls=calls, holders=[Holder("h", 2)], finished=True
    )
    growth, retained = find_facts(trace)
    assert (growth.kind, growth.holder, growth.line, growth.iterations) == (
        "graph-growth",
        "h",
        4,
        2,
    )
    assert retained.kind == "retained-graph" and retained.cause is growth
    assert retained.nbytes == 4096 and retained.buffer_ids == (1,)
    words = analyze(trace)
    assert words[1].message.startswith(
        "Because `h` carries the previous iteration's graph (line 4, the first finding), "
    )
    assert "`h = h.detach()`" in words[0].message


# ----- kept-alive ------------------------------------------------------------------------
def test_running_total_loss_keeps_every_iterations_graph(model):
    data, target = torch.randn(16, 8), torch.randn(16, 1)
    with am.track() as trace:
        total_loss = 0
        for _ in range(3):
            loss = F.mse_loss(model(data), target)
            loss.backward()
            total_loss += loss  # L:ACCUMULATE
    finding = only(trace, "kept-alive")
    assert finding.holder == "total_loss"
    assert finding.line == line_of("ACCUMULATE")
    assert "`total_loss`" in finding.message and "3 iterations" in finding.message
    assert ".item()" in finding.message


def test_running_total_of_item_is_clean(model):
    data, target = torch.randn(16, 8), torch.randn(16, 1)
    with am.track() as trace:
        total_loss = 0.0
        for _ in range(3):
            loss = F.mse_loss(model(data), target)
            loss.backward()
            total_loss += loss.item()
    assert "kept-alive" not in kinds(trace)


def test_list_of_losses_is_reported_by_container_name(model):
    data, target = torch.randn(16, 8), torch.randn(16, 1)
    with am.track() as trace:
        losses = []
        for _ in range(3):
            loss = F.mse_loss(model(data), target)  # L:LOSS
            loss.backward()
            losses.append(loss)  # L:APPEND
    finding = only(trace, "kept-alive")
    assert finding.holder == "losses"
    # The line that took the reference, with the line that computed it beside it.
    assert finding.line == line_of("APPEND")
    assert line_of("LOSS") in finding.related_lines
    assert f"line {line_of('APPEND')} (`losses.append(loss)" in finding.message
    assert f"line {line_of('LOSS')} (`loss = F.mse_loss" in finding.message
    assert "3 tensors" in finding.message


def test_module_attribute_self_loss_is_named_when_never_backpropagated(model):
    class Criterion(nn.Module):
        def forward(self, out, target):
            self.loss = F.mse_loss(out, target)
            return self.loss

    crit = Criterion()
    data, target = torch.randn(16, 8), torch.randn(16, 1)
    with am.track() as trace:
        for _ in range(2):
            crit(model(data), target).item()  # L:CRIT
    finding = only(trace, "unused-graph")
    assert finding.holder == "crit.loss"
    assert finding.line == line_of("CRIT")
    assert "`crit.loss` still holds the last." in finding.message


def test_module_attribute_holding_the_last_backpropagated_loss_is_normal(model):
    # The last iteration's own loss, its graph already released by its backward: nothing to say.
    class Criterion(nn.Module):
        def forward(self, out, target):
            self.loss = F.mse_loss(out, target)
            return self.loss

    crit = Criterion()
    data, target = torch.randn(16, 8), torch.randn(16, 1)
    with am.track() as trace:
        for _ in range(2):
            crit(model(data), target).backward()
    assert trace.holders and trace.findings == []


# ----- graph-growth, retained-graph, backward-through-freed ------------------------------
def test_rnn_hidden_state_with_retain_graph_grows_and_names_the_carried_variable():
    torch.manual_seed(0)
    cell = nn.RNNCell(4, 8)
    with am.track() as trace:
        h = torch.zeros(1, 8)
        for _ in range(4):
            h = cell(torch.randn(1, 4), h)  # L:CARRY
            h.sum().backward(retain_graph=True)  # L:RETAIN
    growth = only(trace, "graph-growth")
    assert growth.holder == "h"
    assert growth.line == line_of("CARRY")
    assert "h = h.detach()" in growth.message
    assert line_of("RETAIN") in growth.related_lines
    retained = only(trace, "retained-graph")
    assert retained.line == line_of("RETAIN")
    assert retained.nbytes > 0


def test_rnn_hidden_state_detached_is_clean():
    torch.manual_seed(0)
    cell = nn.RNNCell(4, 8)
    with am.track() as trace:
        h = torch.zeros(1, 8)
        for _ in range(4):
            h = cell(torch.randn(1, 4), h.detach())
            h.sum().backward()
    assert trace.findings == []


def test_backward_twice_names_the_releasing_backward_and_the_shared_part():
    with am.track() as trace:
        a = torch.rand(1, 4, requires_grad=True)
        b = a**2  # L:SHARED
        c = b * 2
        d = c.mean()
        e = c.sum()
        d.backward()  # L:FIRST
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            e.backward()  # L:SECOND
    finding = only(trace, "backward-through-freed")
    assert finding.line == line_of("SECOND")
    assert line_of("FIRST") in finding.related_lines
    assert line_of("SHARED") in finding.related_lines
    assert "retain_graph=True at line" in finding.message
    assert "the usual better fix is one backward over the sum, `(d + e).backward()`" in (
        finding.message
    )
    assert finding.holder == "e"


def test_retain_graph_then_plain_backward_releases_everything():
    with am.track() as trace:
        a = torch.rand(1, 4, requires_grad=True)
        c = (a**2) * 2
        c.mean().backward(retain_graph=True)
        c.sum().backward()
    assert trace.findings == []


def test_two_heads_on_a_shared_trunk():
    torch.manual_seed(0)
    trunk, head1, head2 = nn.Linear(8, 16), nn.Linear(16, 1), nn.Linear(16, 1)
    x = torch.randn(4, 8)
    with am.track() as trace:
        features = torch.tanh(trunk(x))  # L:TRUNK
        loss1 = head1(features).pow(2).mean()
        loss2 = head2(features).pow(2).mean()
        loss1.backward()  # L:HEAD1
        with pytest.raises(RuntimeError):
            loss2.backward()
    finding = only(trace, "backward-through-freed")
    assert finding.holder == "loss2"
    assert line_of("HEAD1") in finding.related_lines
    assert line_of("TRUNK") in finding.related_lines
    # only the trunk was freed earlier: the failing call's own head is not blamed
    assert f"saved at line {line_of('TRUNK')} that the backward at line {line_of('HEAD1')} " in (
        finding.message
    )
    assert f"retain_graph=True at line {line_of('HEAD1')} " in finding.message
    assert "`(loss1 + loss2).backward()`" in finding.message


def test_a_graph_built_once_and_reused_every_iteration_is_named_not_a_carried_value():
    """Seed 004: x requires grad, so y's graph (built once) is freed by the first backward."""
    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    with am.track() as trace:
        x = torch.randn((20, 1), requires_grad=True)
        y = 1 + 2 * x + 0.3 * torch.randn(20, 1)  # L:BUILT
        y_train = y[:14]  # L:SLICED
        for _ in range(2):
            loss = ((model(x[:14]) - y_train) ** 2).mean()
            if _ == 1:
                with pytest.raises(RuntimeError, match="a second time"):
                    loss.backward()  # L:AGAIN
            else:
                loss.backward()  # L:ONCE
    finding = only(trace, "backward-through-freed")
    assert finding.line == line_of("AGAIN")
    assert {line_of("BUILT"), line_of("SLICED"), line_of("ONCE")} <= set(finding.related_lines)
    assert "built once (line" in finding.message and "detach `y_train`" in finding.message
    assert "h.detach()" not in finding.message


def test_retained_graph_left_unreleased_is_reported_with_bytes():
    x = torch.randn(64, 64, requires_grad=True)
    with am.track() as trace:
        loss = torch.tanh(x @ x).sum()  # only the graph holds tanh's result
        loss.backward(retain_graph=True)  # L:KEEP
    finding = only(trace, "retained-graph")
    assert finding.line == line_of("KEEP")
    assert finding.nbytes == trace.snapshot().retained_bytes > 0
    assert format_bytes(finding.nbytes) in finding.message
    assert finding.holder == "loss"


# ----- in-place and shared-memory writes -------------------------------------------------
def test_inplace_relu_on_a_saved_output_is_reported_before_backward_fails():
    x = torch.randn(10, requires_grad=True)
    with am.track() as trace:
        y = torch.sigmoid(x * 2)  # L:SAVES
        F.relu(y, inplace=True)  # L:WRITE
    finding = only(trace, "inplace-on-saved")
    assert finding.line == line_of("WRITE")
    assert line_of("SAVES") in finding.related_lines
    assert "SigmoidBackward0" in finding.message and "`y`" in finding.message


def test_an_inplace_write_whose_backward_failed_says_so_without_repeating_the_error():
    # GIVEN a write to a saved tensor, then the backward it breaks (issue 22, class 6)
    x = torch.randn(10, requires_grad=True)
    with am.track() as trace:
        y = torch.sigmoid(x * 2)
        y.mul_(2)  # L:WRITE2
        with contextlib.suppress(RuntimeError):
            y.sum().backward()  # L:FAILS
    finding = only(trace, "inplace-on-saved")
    # THEN the finding says the write is why that backward failed, in the past tense, and
    # leaves PyTorch's text to the error and the backward call that report it
    assert f"why the backward at line {line_of('FAILS')} failed" in finding.message
    assert "will fail" not in finding.message
    assert "modified by an inplace operation" not in finding.message


def test_out_of_place_relu_is_clean():
    x = torch.randn(10, requires_grad=True)
    with am.track() as trace:
        y = torch.sigmoid(x * 2)
        z = F.relu(y)
        z.sum().backward()
    assert trace.findings == []


def test_inplace_relu_after_linear_is_clean():
    """relu_ on a tensor nobody saved (addmm does not save its output) is fine."""
    lin = nn.Linear(4, 4)
    with am.track() as trace:
        h = lin(torch.randn(2, 4))
        F.relu(h, inplace=True)
        h.sum().backward()
    assert trace.findings == []


def test_inplace_through_detach_alias_counts_and_shares():
    x = torch.randn(5, requires_grad=True)
    with am.track() as trace:
        y = x.exp()
        d = y.detach()
        d.add_(1)  # L:ALIAS
    assert only(trace, "inplace-on-saved").line == line_of("ALIAS")
    shared = only(trace, "shared-write")
    assert "`d`" in shared.message and "`y`" in shared.message


def test_optimizer_step_on_weights_a_retained_graph_saved():
    torch.manual_seed(0)
    lin = nn.Linear(4, 1)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    x = torch.randn(8, 4, requires_grad=True)
    with am.track() as trace:
        out = (lin(x) ** 2).sum()
        out.backward(retain_graph=True)
        opt.step()  # L:STEP
        with pytest.raises(RuntimeError, match="inplace"):
            out.backward()  # a backward through the stale graph: the step broke it
    finding = only(trace, "inplace-on-saved")
    assert finding.line == line_of("STEP")
    assert "optimizer" in finding.message


def test_numpy_write_to_a_from_numpy_tensor_is_a_shared_write_when_named():
    with am.track() as trace:
        arr = np.zeros(3, dtype=np.float32)
        t = torch.from_numpy(arr)
        t.add_(1)  # L:NPWRITE
    finding = only(trace, "shared-write")
    assert finding.line == line_of("NPWRITE")
    assert "`arr`" in finding.message


def test_clone_then_write_is_clean():
    with am.track() as trace:
        arr = np.zeros(3, dtype=np.float32)
        t = torch.from_numpy(arr).clone()
        t.add_(1)
    assert trace.findings == []
    assert arr.tolist() == [0.0, 0.0, 0.0]


def test_data_write_after_save_is_a_silent_bypass():
    w = torch.randn(5, requires_grad=True)
    with am.track() as trace:
        z = w.exp()  # L:EXP
        z.data.mul_(2)  # L:DATA
        z.sum().backward()
    finding = only(trace, "data-bypass")
    assert finding.line == line_of("DATA")
    assert line_of("EXP") in finding.related_lines
    assert "`z.data`" in finding.message and "silently" in finding.message


def test_numpy_write_after_save_is_a_silent_bypass():
    w = torch.randn(4, requires_grad=True)
    with am.track() as trace:
        arr = np.ones(4, dtype=np.float32)
        src = torch.from_numpy(arr)
        prod = w * src
        arr[0] = 100.0
        prod.sum().backward()  # L:SEEN
    finding = only(trace, "data-bypass")
    assert finding.line == line_of("SEEN")
    assert "`arr`" in finding.message and "`src`" in finding.message


def test_data_write_before_forward_is_clean():
    w = torch.randn(5, requires_grad=True)
    with am.track() as trace:
        w.data.mul_(2)
        w.exp().sum().backward()
    assert "data-bypass" not in kinds(trace)


# ----- unused-graph ----------------------------------------------------------------------
def test_inference_without_no_grad_reports_unused_graph(model):
    with am.track() as trace:
        for _ in range(3):
            out = model(torch.randn(4, 8))  # L:INFER
    assert out.requires_grad
    finding = only(trace, "unused-graph")
    assert finding.line == line_of("INFER")
    assert "torch.no_grad()" in finding.message
    assert finding.nbytes > 0


def test_unused_graphs_say_which_graph_each_variable_holds(model):
    """GIVEN 3 forwards whose first output is kept in `first` and last in `out` WHEN reported
    THEN the finding says `out` holds the last and `first` the first (it said 'the last' of any
    holder), and counts 3 graphs for 3 calls."""
    with am.track() as trace:
        for i in range(3):
            out = model(torch.randn(4, 8))  # L:WHICH
            if i == 0:
                first = out
    finding = only(trace, "unused-graph")
    assert "built 3 autograd graphs" in finding.message
    assert finding.message.endswith("`out` still holds the last, `first` the first.")
    del first


def test_seed_per_sample_forward_graphs_freed_when_out_is_rebound(model):
    """Seed 000: forward every sample, backprop only some; when are the others freed?"""
    data, target = torch.randn(8, 8), torch.randn(8)
    with am.track() as trace:
        total_loss = 0
        for i in range(len(target)):
            out = model(data[i].unsqueeze(0))  # L:FORWARD
            if i % 2:
                continue
            total_loss += F.mse_loss(out.squeeze(), target[i])
            if i % 4 == 2:
                total_loss.backward()  # L:BACKWARD
                total_loss = 0  # L:RESET
    finding = only(trace, "unused-graph")
    assert finding.line == line_of("FORWARD")
    assert f"most at line {line_of('FORWARD')}" in finding.message
    # the accumulated graphs' buffers go at the backward line, their nodes when reset
    used = [b for b in trace.buffers if b.freed and b.freed_line == line_of("BACKWARD")]
    assert used
    assert any(n.freed_line == line_of("RESET") for n in trace.nodes)


def test_a_partial_batch_left_in_the_running_sum_is_named(model):
    """Seed 000: the last samples skip the flush, so `total_loss` keeps losses no backward used."""
    data, target = torch.randn(8, 8), torch.randn(8)
    with am.track() as trace:
        total_loss, count = 0, 0
        for i in range(len(target)):
            out = model(data[i].unsqueeze(0))
            total_loss += F.mse_loss(out.squeeze(), target[i])  # L:SUM
            count += 1
            if count == 3:
                total_loss.backward()  # L:FLUSH
                total_loss, count = 0, 0
    finding = only(trace, "unused-graph")
    assert finding.holder == "total_loss"
    assert finding.line == line_of("SUM")
    assert finding.related_lines == (line_of("FLUSH"),)
    assert finding.message.startswith(
        f"`total_loss` still holds 2 results of line {line_of('SUM')}"
    )
    assert "nothing to the gradients" in finding.message


def test_a_running_sum_flushed_every_time_leaves_nothing(model):
    data, target = torch.randn(6, 8), torch.randn(6)
    with am.track() as trace:
        total_loss = 0
        for i in range(len(target)):
            total_loss += F.mse_loss(model(data[i : i + 1]).squeeze(), target[i])
            if i % 3 == 2:
                total_loss.backward()
                total_loss = 0
    assert trace.findings == []


def test_a_data_write_names_the_detached_copy_it_changed_and_not_the_clone():
    """Seed 003: `c = a.detach()` follows `a.data *= 3`; `b = a.clone()` does not."""
    with am.track() as trace:
        a = torch.tensor(1.0, requires_grad=True)
        b = a.clone()
        c = a.detach()
        a.data *= 3  # L:DATA_WRITE
        b += 1
    finding = only(trace, "shared-write")
    assert finding.line == line_of("DATA_WRITE") and finding.holder == "a.data"
    assert "also changed `c` (detach), which shares memory with `a.data`" in finding.message
    assert "`b`" not in finding.message
    assert c.item() == 3.0 and b.item() == 2.0


def test_every_kind_is_documented_and_analyze_is_pure_over_json():
    x = torch.randn(5, requires_grad=True)
    with am.track() as trace:
        y = x.exp()
        y.add_(1)
    loaded = am.Trace.from_json(trace.to_json())
    assert [f.kind for f in analyze(loaded)] == kinds(trace)
    assert set(kinds(trace)) <= set(KINDS)


def test_a_carried_lstm_state_is_named_with_the_tuple_detach():
    """Seed 004: an LSTM's (h, c) carried across batches without detach."""
    torch.manual_seed(0)
    lstm = nn.LSTM(1, 4)
    with am.track() as trace:
        hidden = (torch.zeros(1, 1, 4), torch.zeros(1, 1, 4))
        for step in range(2):
            out, hidden = lstm(torch.randn(5, 1, 1), hidden)  # L:CARRIED
            if step:
                with pytest.raises(RuntimeError, match="a second time"):
                    out.sum().backward()
            else:
                out.sum().backward()
    finding = only(trace, "backward-through-freed")
    assert line_of("CARRIED") in finding.related_lines
    assert "`hidden = tuple(t.detach() for t in hidden)`" in finding.message


def test_a_write_to_a_tensor_no_name_reaches_never_shows_the_recorders_label():
    """GIVEN exp's saved output written in place inside one expression (no variable holds it)
    THEN the finding says an unnamed tensor, not the recorder's `tensor#1`."""
    x = torch.randn(3, requires_grad=True)
    with am.track() as trace, pytest.raises(RuntimeError, match="inplace"):
        x.exp().mul_(2).sum().backward()  # L:UNNAMED_WRITE
    finding = only(trace, "inplace-on-saved")
    assert finding.line == line_of("UNNAMED_WRITE") and finding.holder is None
    assert "on an unnamed tensor" in finding.message and "#" not in finding.message


def test_a_state_dict_remade_each_iteration_for_a_soft_update_is_no_shared_write():
    """GIVEN the DQN tutorial's soft update: `sd = net.state_dict()` each iteration, whose
    detached tensors the next optimizer step changes before `sd` is rebound THEN no finding;
    a snapshot kept past the writes still is one, named by the user's variable."""
    torch.manual_seed(0)
    net, target = nn.Linear(3, 2), nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with am.track() as trace:
        for _ in range(3):
            opt.zero_grad()
            net(torch.randn(4, 3)).sum().backward()
            opt.step()
            sd = net.state_dict()
            target.load_state_dict({k: 0.9 * target.state_dict()[k] + 0.1 * sd[k] for k in sd})
    assert trace.findings == []
    with am.track() as trace:
        best = net.state_dict()
        for _ in range(2):
            opt.zero_grad()
            net(torch.randn(4, 3)).sum().backward()
            opt.step()  # L:SNAPSHOT_STEP
    found = trace.findings
    assert set(best) == {"weight", "bias"}  # read after the block: a snapshot meant to stay
    assert [f.kind for f in found] == ["shared-write", "shared-write"]
    assert all(f.line == line_of("SNAPSHOT_STEP") and "`best['" in f.message for f in found)
