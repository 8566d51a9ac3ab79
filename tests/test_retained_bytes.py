"""Retained bytes are what the graphs alone hold: checked against an independent count.

The truth (`retained_truth.measure`) uses its own saved-tensor hooks that keep only storage
addresses and sizes, and subtracts the storages the case's own namespace and its model still
hold; `track()` must give the same end value and peak, within 1%, on models that save memory
made without grad (issue 21: the old rule missed 16x on an LSTM)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from retained_cases import CASES
from retained_truth import measure

import autograd_magic as am
from autograd_magic.analysis.result import analyze
from autograd_magic.report.buffers import buffer_table


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_retained_and_peak_match_an_independent_count(case, gc_disabled):
    """GIVEN a model saving masks, workspaces, statistics or casts WHEN tracked THEN retained
    bytes at the end and their peak are within 1% of the independent count."""
    end, peak = measure(case)
    with am.track() as trace:
        namespace = case()
    assert end > 0
    assert trace.retained_bytes == pytest.approx(end, rel=0.01)
    assert trace.peak_retained_bytes == pytest.approx(peak, rel=0.01)
    assert max(s.retained_bytes for s in trace.timeline) <= trace.peak_retained_bytes
    del namespace


def test_an_lstm_workspace_counts_and_says_why_other_tensors_do_not(gc_disabled):
    """GIVEN LSTM outputs kept in a list WHEN tracked THEN the uint8 workspace counts as retained,
    the kept outputs' storage is 'shares a live tensor', the weights are parameters."""
    torch.manual_seed(0)
    lstm = nn.LSTM(8, 16, num_layers=2)
    outs = []
    with am.track() as trace:
        for _ in range(3):
            out, _ = lstm(torch.randn(4, 2, 8))
            outs.append(out)
    table = buffer_table(analyze(trace))
    dtype, kind = table.headers.index("dtype"), table.headers.index("kind")
    kinds = {(row[dtype], row[kind]) for row in table.rows}
    assert ("uint8", "activation") in kinds
    assert ("float32", "parameter") in kinds
    assert ("float32", "shares a live tensor") in kinds  # the kept outputs
    workspace = [b for b in trace.buffers if b.dtype == "uint8"]
    assert workspace and all(b.retained for b in workspace)
    del outs


def test_a_dataset_view_and_a_numpy_array_are_not_counted(gc_disabled):
    """GIVEN batches sliced from a dataset tensor and a from_numpy input WHEN tracked THEN the
    dataset's and the array's memory are not retained, even after the batch variable is gone."""
    data = torch.randn(1000, 8)
    array = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    w = torch.randn(8, 8, requires_grad=True)
    with am.track() as trace:
        losses = [(data[i : i + 4] @ w).sum() for i in range(0, 12, 4)]
        losses.append((torch.from_numpy(array) @ w).sum())
    assert trace.retained_bytes == 0
    assert {b.held_by for b in trace.buffers} == {"live tensor", "NumPy array"}
    del losses


def test_a_tensor_the_code_drops_counts_from_then_on(gc_disabled):
    """GIVEN an input saved by the graph WHEN the code drops its last reference inside the block
    THEN at the end only the graph holds it: it counts."""
    w = torch.randn(64, 64, requires_grad=True)
    with am.track() as trace:
        x = torch.randn(32, 64)
        loss = (x @ w).sum()
        del x
    assert trace.retained_bytes == 32 * 64 * 4
    del loss


def test_backward_calls_free_what_was_retained(gc_disabled):
    """GIVEN kept graphs then backward through each WHEN tracked THEN each call frees what its
    graph alone held, and the calls' frees add up to the peak."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.Tanh(), nn.Linear(32, 1))
    with am.track() as trace:
        losses = [model(torch.randn(8, 16)).sum() for _ in range(3)]
        for loss in losses:
            loss.backward()
        del loss
    freed = [c.released_bytes for c in trace.backward_calls]
    assert len(set(freed)) == 1 and freed[0] > 0
    assert sum(freed) == trace.peak_retained_bytes
    assert trace.retained_bytes == 0


def test_retained_bytes_read_inside_a_block_is_exact_at_that_moment(gc_disabled):
    """GIVEN saved tensors some of which the code still holds WHEN `trace.retained_bytes` (and
    `snapshot()`) is read inside the block THEN it counts only what the graph alone holds, as
    the end state does (was: an input the code holds counted until the next refresh, backward
    or the block's end; issue 36, item 3)."""
    with am.track() as trace:
        x = torch.randn(64, 32)  # the code holds it: not the graph's alone
        w = torch.randn(32, 32, requires_grad=True)
        y = (x @ w).tanh().sum()  # saves x, w and tanh's output (the graph's alone)
        inside = trace.retained_bytes
        inside_snapshot = trace.snapshot().retained_bytes
    assert inside == inside_snapshot == trace.retained_bytes == 64 * 32 * 4
    del x, w, y
