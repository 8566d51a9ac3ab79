"""The recorder's per-op fast paths record exactly what its general paths record.

The fast paths (ops of kind PLAIN, sites cached by instruction offset, one call per node born or
freed) exist only for speed: turning them off must not change a single record.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from markers import marker_lines
from torch import nn

import autograd_magic as am
import autograd_magic.recorder.core as recorder_module
import autograd_magic.recorder.mode as mode_module
from autograd_magic.model.records import Site
from autograd_magic.recorder.sites import SiteFinder

line_of = marker_lines(__file__)


class _NoFastOps(set):
    """A `PLAIN` set that stays empty: every op takes the general `OpRecording.general` path."""

    def add(self, item: object) -> None:
        pass


class _UncachedSites(SiteFinder):
    """Sites found by walking and decoding the line table on every event (no offset cache)."""

    def here(self, skip: int = 1) -> Site:
        self._by_code.clear()
        return super().here(skip + 1)


def _workload() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, target = torch.randn(5, 6), torch.randn(5, 2)
    w = torch.randn(4, requires_grad=True)
    for _ in range(2):
        y = w
        for _ in range(3):
            y = (y * 1.5 + 0.1).sin().tanh()
        a, b = y.split(2)
        (a.sum() + b.exp().sum()).backward()
        loss = F.mse_loss(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    kept = (w * 2).relu()
    del kept


def _export(trace: am.Trace) -> dict:
    document = json.loads(trace.to_json())
    for buffer in document["buffers"]:
        buffer["storage_key"] = 0  # a memory address: differs between runs
    return document


def _record() -> dict:
    _workload()  # first-call effects (lazy imports, caches inside torch) happen untracked
    with am.track() as trace:
        _workload()
    return _export(trace)


def test_fast_op_path_records_the_same_as_the_general_path(gc_disabled, monkeypatch):
    """GIVEN the same training code WHEN recorded with and without the per-op fast path
    THEN every record, counter and timeline sample is the same."""
    fast = _record()
    no_fast_ops = _NoFastOps()
    monkeypatch.setattr(mode_module, "PLAIN", no_fast_ops)
    general = _record()
    assert general == fast


def test_cached_sites_equal_uncached_sites(gc_disabled, monkeypatch):
    """GIVEN the same code WHEN sites are cached by instruction offset or found afresh each time
    THEN every record is the same."""
    cached = _record()
    monkeypatch.setattr(recorder_module, "SiteFinder", _UncachedSites)
    uncached = _record()
    assert uncached == cached


def _helper(x: torch.Tensor) -> torch.Tensor:
    return x.exp()  # L:helper


def test_one_helper_called_from_two_lines_keeps_each_callers_line(gc_disabled):
    """GIVEN a helper called from two lines (its frames may reuse one address) WHEN tracked
    THEN each node has the helper's line and the line of the call that made it."""
    x = torch.randn(3, requires_grad=True)
    with am.track() as trace:
        for _ in range(2):
            a = _helper(x)  # L:first
            b = _helper(x)  # L:second
    sites = [n.born_site for n in trace.nodes if n.name == "ExpBackward0"]
    assert [s.line for s in sites] == [line_of("helper")] * 4
    assert [s.outer_line for s in sites] == [line_of("first"), line_of("second")] * 2
    del a, b


def test_nodes_freed_in_a_helper_get_the_callers_line(gc_disabled):
    """GIVEN graphs dropped inside a helper called from two lines WHEN tracked THEN each death
    has the line of the call that dropped it."""
    x = torch.randn(3, requires_grad=True)
    held = []

    def drop() -> None:
        held.pop()  # L:drop

    with am.track() as trace:
        held.append(x.exp())
        drop()  # L:drop-first
        held.append(x.sin())
        drop()  # L:drop-second
    freed = {n.name: n.freed_site for n in trace.nodes if n.name != "AccumulateGrad"}
    assert freed["ExpBackward0"].line == line_of("drop")
    assert freed["ExpBackward0"].outer_line == line_of("drop-first")
    assert freed["SinBackward0"].outer_line == line_of("drop-second")


def test_live_buffer_count_follows_saves_and_releases(gc_disabled):
    """GIVEN buffers saved then released by backward WHEN an in-place write follows THEN the
    live count drops to zero and the write hits no buffer; a write while one is held hits it."""
    x = torch.randn(4, requires_grad=True)
    recorder = am.track()
    with recorder as trace:
        y = x * 1.0
        z = y.exp()  # saves its output
        assert recorder.writer.live_buffers == 1
        with torch.no_grad():
            z.add_(1.0)  # L:hit
        alias = z.detach()
        del z  # the graph dies: exp's saved output is released
        assert recorder.writer.live_buffers == 0
        with torch.no_grad():
            alias.add_(1.0)  # L:released
        with torch.no_grad():
            y.add_(1.0)  # L:miss
    hit, released, miss = trace.version_bumps
    assert hit.line == line_of("hit") and hit.hit_buffers == (trace.buffers[0].id,)
    assert released.line == line_of("released") and released.hit_buffers == ()
    assert miss.line == line_of("miss") and miss.hit_buffers == ()


def test_labels_and_holders_are_the_same_when_the_walk_is_skipped(gc_disabled):
    """GIVEN a block that leaves nothing alive WHEN it ends THEN there are no holders and every
    label is an op label; GIVEN one that keeps a graph THEN its holder is named."""
    x = torch.randn(3, requires_grad=True)
    with am.track() as empty:
        (x.exp() * 2).sum().backward()
    assert empty.holders == [] and empty.live_nodes == 0
    assert not any(b.label for b in empty.version_bumps)
    with am.track() as kept:
        loss = (x.exp() * 2).sum()
    assert [h.path for h in kept.holders] == ["loss"]
    del loss


def test_a_write_hits_every_live_buffer_on_its_storage_in_saving_order(gc_disabled):
    """GIVEN two buffers saved on one storage (and others elsewhere, one released) WHEN that
    storage is written in place THEN the write names both, in the order they were saved."""
    x = torch.randn(4, requires_grad=True)
    with am.track() as trace:
        y = x * 1.0
        a = y.sin()  # saves y
        b = y.cos()  # saves y
        c = y.exp().sum()  # saves the exp output, on another storage
        d = y.tan()  # saves its output; released below
        del d
        with torch.no_grad():
            y.add_(1.0)
    saved_y = [buf.id for buf in trace.buffers if buf.node_id in _ids(trace, "Sin", "Cos")]
    (bump,) = trace.version_bumps
    assert len(saved_y) == 2 and bump.hit_buffers == tuple(saved_y)
    del a, b, c


def _ids(trace: am.Trace, *prefixes: str) -> set[int]:
    return {n.id for n in trace.nodes if n.name.startswith(prefixes)}


def test_saved_attribute_filter_keeps_every_attribute_that_may_hold_a_tensor():
    """GIVEN values a saved attribute can return WHEN judged THEN only numbers, dtypes and
    non-empty sequences without tensors are marked as never holding one."""
    from autograd_magic.recorder.saved import _holds_no_tensor

    assert _holds_no_tensor(1) and _holds_no_tensor(2.5) and _holds_no_tensor(torch.float32)
    assert _holds_no_tensor((2, 4)) and _holds_no_tensor([1])
    assert not _holds_no_tensor(None) and not _holds_no_tensor(torch.ones(1))
    assert not _holds_no_tensor(()) and not _holds_no_tensor((None, 3))
    assert not _holds_no_tensor((torch.ones(1),))


def test_buffers_of_multi_node_ops_keep_their_owner_once_attributes_are_filtered(gc_disabled):
    """GIVEN a Linear layer called in two blocks (the second probes only tensor attributes)
    WHEN tracked THEN both blocks give each saved buffer to the same node kind."""
    import autograd_magic.recorder.saved as saved_module

    saved_module._PROBED_ATTRS.clear()
    layer = nn.Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    owners = []
    for _ in range(2):
        with am.track() as trace:
            out = layer(x * 2)
        names = {n.id: n.name for n in trace.nodes}
        owners.append(sorted(names.get(b.node_id, "") for b in trace.buffers))
        del out
    assert owners[0] == owners[1] and owners[0].count("AddmmBackward0") >= 2


def test_a_3d_linear_gives_its_buffers_to_addmm_in_every_step(gc_disabled, monkeypatch):
    """GIVEN F.linear on a 3-D input (view, addmm, view: several nodes, one of them saving)
    tracked in three blocks, the first of which learns what each node type saves WHEN its
    buffers are assigned THEN every block gives all of them to AddmmBackward0, the later ones
    without reading saved attributes back through the unpack hook."""
    import autograd_magic.recorder.nodes as nodes_module
    import autograd_magic.recorder.saved as saved_module

    saved_module._PROBED_ATTRS.clear()
    probed: list[str] = []

    def probe(node: object, hook: object) -> None:
        probed.append(type(node).__name__)
        saved_module.probe_saved(node, hook)

    monkeypatch.setattr(nodes_module, "probe_saved", probe)
    layer = nn.Linear(4, 3)
    x = torch.randn(2, 5, 4, requires_grad=True)
    owners, probes = [], []
    for _ in range(3):
        probed.clear()
        with am.track() as trace:
            out = layer(x * 2)
        names = {n.id: n.name for n in trace.nodes}
        owners.append([names.get(b.node_id, "") for b in trace.buffers])
        probes.append(len(probed))
        del out
    assert owners == [["AddmmBackward0", "AddmmBackward0"]] * 3
    assert probes[0] > 0 and probes[1:] == [0, 0]
