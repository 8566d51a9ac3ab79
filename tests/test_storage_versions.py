"""Shared storage groups and version counters, labelled with the user's own variable names."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from markers import marker_lines
from torch import nn

import autograd_magic as am

line_of = marker_lines(__file__)


def group_of(trace: am.Trace, label: str) -> am.StorageGroup:
    (group,) = [g for g in trace.storage_groups() if label in g.members]
    return group


# ----- storage groups -------------------------------------------------------------------------


def test_detach_views_and_data_join_the_group_of_their_source():
    """GIVEN a detach, a slice, a view and `.data` of `a` THEN all share `a`'s group, each with
    how it got there."""
    with am.track() as trace:
        a = torch.randn(4, 3, requires_grad=True)
        d = a.detach()
        s = a[1:]
        v = a.view(12)
        tt = a.t()
        raw = a.data
    group = group_of(trace, "a")
    assert set(group.members) == {"a", "d", "s", "v", "tt", "raw"}
    assert group.how == {
        "a": "original",
        "d": "detach",
        "s": "__getitem__",
        "v": "view",
        "tt": "t",
        "raw": "data",
    }
    del d, s, v, tt, raw


def test_numpy_sharing_and_copies():
    """GIVEN from_numpy, .numpy() and as_tensor on one array, and torch.tensor / clone copies
    THEN sharers form one group and copies are listed as "copied from", never as members."""
    with am.track() as trace:
        arr = np.arange(6, dtype=np.float32)
        t = torch.from_numpy(arr)
        back = t.numpy()
        shared = torch.as_tensor(arr)
        copied = torch.tensor(arr)
        c = t.clone()
    group = group_of(trace, "arr")
    assert set(group.members) == {"arr", "t", "back", "shared"}
    assert group.how["t"] == "from_numpy"
    assert group.how["back"] == "numpy"
    assert group.how["shared"] == "as_tensor"
    assert group.copies == {"copied": "arr", "c": "t"}
    assert all("copied" not in g.members and "c" not in g.members for g in trace.storage_groups())
    assert np.shares_memory(arr, back) and not np.shares_memory(arr, copied.numpy())
    del c, shared


def test_as_tensor_that_must_convert_is_a_copy():
    """GIVEN as_tensor with a dtype change THEN the result is a copy, not a sharer."""
    with am.track() as trace:
        arr = np.ones(3, dtype=np.float64)
        converted = torch.as_tensor(arr, dtype=torch.float32)
    assert all("converted" not in g.members for g in trace.storage_groups())
    assert not np.shares_memory(arr, converted.numpy())


def test_labels_are_user_paths_when_bound_else_op_labels():
    """GIVEN tensors bound to a local, a list item and a module attribute, and one bound to
    nothing THEN labels are `w`, `losses[3]`, `model.fc.weight`, and an op label."""
    model = nn.Sequential()
    model.fc = nn.Linear(3, 3)
    losses = [torch.zeros(1) for _ in range(5)]
    with am.track() as trace:
        w = model.fc.weight.detach()
        losses[3] = torch.randn(3).exp()
        first = losses[3].detach()
        last = w.detach().view(9)  # the detach in the middle is bound to no name
    assert set(group_of(trace, "model.fc.weight").members) >= {"model.fc.weight", "w", "last"}
    assert set(group_of(trace, "losses[3]").members) == {"losses[3]", "first"}
    unnamed = [m for m in group_of(trace, "w").members if m not in {"model.fc.weight", "w", "last"}]
    assert len(unnamed) == 1 and re.fullmatch(r"\w+#\d+", unnamed[0])
    del first, last


def test_tensors_among_plain_numbers_keep_their_index_in_the_label():
    """GIVEN a training history of 5,000 floats with a tensor appended, a short list holding a
    number and a tensor, lists of metric pairs, and a dict of floats and a tensor THEN the
    tensors are named `history[5000]`, `pair[1]`, `epochs[2][1]` and `stats['w']` (the walk skips
    plain numbers and short lists of them, never what comes after them)."""
    history: list = [0.5 + i * 1e-4 for i in range(5000)]
    epochs: list = [[0.1, 0.2], [0.3, 0.4]]
    with am.track() as trace:
        # Each a detached alias: tracked as a storage member, so it gets a label.
        history.append(torch.randn(3).exp().detach())
        pair = [1.5, torch.randn(2).exp().detach()]
        epochs.append([0.5, torch.randn(4).exp().detach()])
        stats = {"lr": 0.1, "loss": 2.0, "w": torch.randn(5).exp().detach()}
    labels = set(trace.labels.values())
    assert {"history[5000]", "pair[1]", "epochs[2][1]", "stats['w']"} <= labels
    del pair, stats


def test_a_tracked_tensor_among_a_datasets_plain_tensors_is_still_named():
    """GIVEN a list of 1,000 (x, y) tensor samples and one of 500 {"x": tensor, "y": int}
    records (not tracked: the names walk skips them), and one of each appended in the block
    whose x is a detached alias THEN those are `samples[1000][0]` and `records[500]['x']`."""
    samples = [(torch.randn(2), torch.tensor(i)) for i in range(1000)]
    records = [{"x": torch.randn(2), "y": 1} for _ in range(500)]
    with am.track() as trace:
        samples.append((torch.randn(3).exp().detach(), torch.tensor(0)))
        records.append({"x": torch.randn(3).exp().detach(), "y": 0})
    assert {"samples[1000][0]", "records[500]['x']"} <= set(trace.labels.values())


# ----- version counters -----------------------------------------------------------------------


def test_inplace_ops_record_old_new_line_and_aliases_sharing_the_counter():
    """GIVEN in-place writes on a tensor with a detached alias and a view THEN each write records
    label, op, line, old -> new and the aliases whose version moved with it."""
    with am.track() as trace:
        a = torch.randn(4)
        d = a.detach()
        part = a[:2]
        d.mul_(2)  # L:mul
        a += 1  # L:iadd
        torch.relu_(part)  # L:relu
    mul, iadd, relu = trace.version_bumps
    assert (mul.label, mul.op, mul.line, mul.old, mul.new) == ("d", "mul_", line_of("mul"), 0, 1)
    assert set(mul.affected) == {"a", "part"}
    assert (iadd.label, iadd.old, iadd.new, iadd.line) == ("a", 1, 2, line_of("iadd"))
    assert iadd.op in {"__iadd__", "add_"}
    assert (relu.label, relu.op, relu.old, relu.new) == ("part", "relu_", 2, 3)
    assert not any(b.bypass for b in trace.version_bumps)
    assert a._version == 3 and d._version == 3


def test_writes_through_data_bypass_the_counter():
    """GIVEN a write through `.data` THEN it is recorded as a bypass of the source's counter."""
    with am.track() as trace:
        x = torch.randn(3, requires_grad=True)
        raw = x.data
        raw.add_(1)  # L:data-write
    (bump,) = trace.version_bumps
    assert bump.label == "raw" and bump.line == line_of("data-write")
    assert bump.bypass and bump.bypassed == "x"
    assert x._version == 0  # autograd never saw it: that is why it is a bypass


def test_numpy_writes_are_recorded_once_as_bypass():
    """GIVEN a NumPy write to an array shared by several tensors WHEN the block ends
    THEN one bypassing write is recorded against the array (no version moved)."""
    with am.track() as trace:
        arr = np.zeros(4, dtype=np.float32)
        t = torch.from_numpy(arr)
        alias = torch.as_tensor(arr)
        arr[1] = 7.0
    (bump,) = trace.version_bumps
    del alias
    assert (bump.label, bump.op, bump.bypass) == ("arr", "numpy write", True)
    assert bump.old == bump.new == t._version == 0
    assert bump.bypassed in {"t", "alias"}


def test_inplace_write_to_a_saved_tensor_names_the_buffer_it_hit():
    """GIVEN an in-place write to a tensor a live graph saved THEN the bump lists that buffer."""
    x = torch.randn(3, requires_grad=True)
    with am.track() as trace:
        y = x.exp()
        z = y.sin()
        y.mul_(2)
    (bump,) = trace.version_bumps
    saved = [b.id for b in trace.buffers if b.shape == (3,) and not b.is_leaf]
    assert bump.hit_buffers and set(bump.hit_buffers) <= set(saved)
    del z


def test_a_write_inside_a_library_call_is_recorded_only_when_it_hits_a_saved_tensor():
    """GIVEN nn.Embedding(max_norm=1), whose F.embedding renormalizes the weight in place where
    the function mode does not see it: alone (nothing saved) its write is no record; after
    `emb.weight @ w` saved the weight it is one hidden write, naming the call and module, and
    the values and the in-place error stay PyTorch's own."""
    torch.manual_seed(0)
    emb = nn.Embedding(4, 3, max_norm=1.0)
    w = torch.randn(3, 2, requires_grad=True)
    idx = torch.tensor([1, 2])
    with am.track() as trace:
        first = emb(idx)
        a = emb.weight @ w
        b = emb(torch.tensor([0, 3]))  # L:LIBRARY_WRITE
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (a.sum() + b.sum()).backward()
    (bump,) = trace.version_bumps
    assert (bump.label, bump.op, bump.hidden, bump.module) == (
        "emb.weight",
        "embedding",
        True,
        "emb",
    )
    assert bump.line == line_of("LIBRARY_WRITE") and bump.hit_buffers
    assert emb.weight.norm(dim=1).max() <= 1.0 + 1e-6 and first.shape == (2, 3)
