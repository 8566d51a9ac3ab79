"""Findings built from hand-made records, no recorder run (issue 22): each class of mistake the
corpus of real loops showed (tests/findings_corpus.py) has a test here on the records alone."""

from __future__ import annotations

from autograd_magic.analysis.findings import find_facts
from autograd_magic.model.records import (
    BackwardCall,
    Finding,
    Holder,
    NodeRecord,
    SavedBuffer,
    Site,
)
from autograd_magic.model.trace import Trace
from autograd_magic.report.wording import finding

CELL = "<records-cell>"


def analyze(trace: Trace) -> list[Finding]:
    """The trace's findings, worded, computed here (not read from `trace.findings`)."""
    return [finding(f) for f in find_facts(trace)]


def site(line: int, inner: int | None = None, function: str = "forward") -> Site:
    """A cell line, or a line `inner` of `function` called from cell line `line`."""
    if inner is None:
        return Site(CELL, line)
    return Site(CELL, inner, function, outer_line=line)


def node(nid: int, name: str, seq: int, where: Site, nexts=(), **kw) -> NodeRecord:
    return NodeRecord(nid, name, seq, where, tuple(nexts), **kw)


def buffer(bid: int, nid: int, seq: int, where: Site, nbytes: int = 1024, **kw) -> SavedBuffer:
    return SavedBuffer(
        bid,
        nid,
        (nbytes // 4,),
        "float32",
        "cpu",
        nbytes,
        nbytes,
        False,
        False,
        0,
        seq,
        where,
        storage_key=bid,
        **kw,
    )


def trace_of(nodes, buffers, calls=(), holders=()) -> Trace:
    trace = Trace.from_records(list(nodes), list(buffers), finished=True)
    trace.backward_calls = list(calls)
    trace.holders = list(holders)
    return trace


def step(first_seq: int, line0: int = 1, freed: int | None = None):
    """One training step: w (leaf), Mm (saves 1 KiB) at line0, Sum at line0 + 1, walked by the
    backward at line0 + 2 whose index is `first_seq // 10`."""
    index = first_seq // 10
    w = node(first_seq, "AccumulateGrad", first_seq, site(line0), reached_by=index)
    mm = node(first_seq + 1, "MmBackward0", first_seq + 1, site(line0), (w.id,), reached_by=index)
    loss = node(
        first_seq + 2,
        "SumBackward0",
        first_seq + 2,
        site(line0 + 1),
        (mm.id,),
        reached_by=index,
        freed_seq=freed,
        freed_site=None if freed is None else site(line0 + 1),
    )
    saved = buffer(first_seq, mm.id, first_seq + 1, site(line0), freed_seq=first_seq + 4)
    call = BackwardCall("backward", first_seq + 3, site(line0 + 2), False, False, first_seq + 4)
    call.root_ids, call.reached = (loss.id,), (w.id, mm.id, loss.id)
    return [w, mm, loss], [saved], call


# ----- class 2: unused graphs ------------------------------------------------------------------
def test_a_metric_computed_from_a_trained_graph_is_no_finding():
    # GIVEN a step, then `ppl.append(loss.exp().item())`: an Exp on the trained loss, freed at once
    nodes, buffers, call = step(0)
    exp = node(50, "ExpBackward0", 5, site(4), (2,), freed_seq=6, freed_site=site(4))
    trace = trace_of([*nodes, exp], [*buffers, buffer(50, 50, 5, site(4), 4, freed_seq=6)], [call])
    # THEN nothing is said: it is what a correct loop does
    assert analyze(trace) == []


def test_a_forward_dropped_in_the_expression_that_built_it_is_no_finding():
    # GIVEN `fake = G(z).detach()` after a step: a forward of its own, dead before anything else
    nodes, buffers, call = step(0)
    g = node(60, "MmBackward0", 6, site(5), (0,), freed_seq=7, freed_site=site(5))
    trace = trace_of([*nodes, g], [*buffers, buffer(60, 60, 6, site(5), freed_seq=7)], [call])
    assert analyze(trace) == []


def test_an_unused_forward_held_past_its_moment_is_named_at_the_line_that_built_it():
    # GIVEN a forward (Mm, 4 KiB saved) at line 6 consumed by a Cat at line 7 that saves
    # nothing, rebound only after the next forward was built
    nodes, buffers, call = step(0)
    mm1 = node(60, "MmBackward0", 6, site(6), (0,), freed_seq=20, freed_site=site(6))
    cat1 = node(61, "CatBackward0", 7, site(7), (60,), freed_seq=20, freed_site=site(6))
    mm2 = node(62, "MmBackward0", 9, site(6), (0,))
    cat2 = node(63, "CatBackward0", 10, site(7), (62,))
    saved = [buffer(60, 60, 6, site(6), 4096, freed_seq=20), buffer(62, 62, 9, site(6), 4096)]
    trace = trace_of(
        [*nodes, mm1, cat1, mm2, cat2], [*buffers, *saved], [call], [Holder("out", 63)]
    )
    # THEN one finding at the building line 6, not the consuming line 7, naming the holder
    (found,) = analyze(trace)
    assert (found.kind, found.line, found.holder) == ("unused-graph", 6, "out")
    assert "2 graphs built at line 6" in found.message


def test_a_list_of_outputs_no_backward_used_is_one_finding_with_no_grad_advice():
    # GIVEN `outs.append(model(x))` twice and no backward (validation without no_grad)
    leaf = node(1, "AccumulateGrad", 1, site(2))
    mms = [node(2 + i, "MmBackward0", 2 + i, site(2), (1,)) for i in range(2)]
    saved = [buffer(i, m.id, m.born_seq, site(2)) for i, m in enumerate(mms)]
    holders = [Holder(f"outs[{i}]", m.id) for i, m in enumerate(mms)]
    trace = trace_of([leaf, *mms], saved, holders=holders)
    # THEN one finding about `outs` (not a second one about the same graphs), and no `.item()`
    (found,) = analyze(trace)
    assert (found.kind, found.holder) == ("kept-alive", "outs")
    assert "torch.no_grad()" in found.message
    assert ".item()" not in found.message


# ----- class 1 and 4: the line where the reference is taken, and a fix that fits the code -----
def test_a_write_inside_a_helper_is_reported_at_the_helper_line_with_its_own_out_of_place_form(
    tmp_path,
):
    from autograd_magic.model.records import VersionBump

    # GIVEN a cell whose helper clamps in place what sigmoid saved (line 2 of the file)
    cell = tmp_path / "cell.py"
    cell.write_text("def clamp_probs(p):\n    p.clamp_(1e-6, 1 - 1e-6)\n    return p\n")
    where = Site(str(cell), 2, "clamp_probs", outer_line=7)
    # (built in an earlier cell: no unused-graph finding about it here)
    sig = node(1, "SigmoidBackward0", 1, Site(str(cell), 6), existed_before=True)
    saved = buffer(1, 1, 1, Site(str(cell), 6))
    trace = trace_of([sig], [saved])
    trace.version_bumps = [VersionBump("p", "clamp_", 0, 1, 2, where, hit_buffers=(1,))]
    # THEN the finding is at the helper's line, the call line related, the fix in its own words
    (found,) = analyze(trace)
    assert (found.kind, found.line, found.holder) == ("inplace-on-saved", 2, "p")
    assert 7 in found.related_lines
    assert "`p = p.clamp(1e-6, 1 - 1e-6)`" in found.message
    assert "line 2 of `clamp_probs` (`p.clamp_(1e-6, 1 - 1e-6)`), called at line 7" in found.message
    assert "x = x + 1" not in found.message


def test_a_statistic_a_forward_keeps_with_its_graph_is_fixed_with_detach_not_item(tmp_path):
    # GIVEN `self.running_mean = 0.9 * self.running_mean + 0.1 * h.mean(0)` in a forward
    # (line 3) called from cell line 9, chaining three iterations no backward walks
    cell = tmp_path / "cell.py"
    cell.write_text("\n\n        self.running_mean = 0.9 * self.running_mean + 0.1 * h\n")
    inner = Site(str(cell), 3, "forward", outer_line=9)
    nodes, buffers, calls = [], [], []
    prev = None
    for i in range(3):
        n, b, call = step(10 * i)
        nodes += n
        buffers += b
        calls.append(call)
        stat = node(
            100 + i, "AddBackward0", 10 * i + 2, inner, (1 + 10 * i, *([prev] if prev else []))
        )
        nodes.append(stat)
        prev = stat.id
    trace = trace_of(nodes, buffers, calls, [Holder("norm.running_mean", prev)])
    (found,) = analyze(trace)
    assert (found.kind, found.line, found.holder) == ("kept-alive", 3, "norm.running_mean")
    assert found.related_lines == (9,)
    assert "`self.running_mean = (0.9 * self.running_mean + 0.1 * h).detach()`" in found.message
    assert ".item()" not in found.message


# ----- class 3 and 5: cause first, and nothing said of a graph nobody backpropagates ----------
def retained_then_step(later_backward: bool, create_graph: bool = False) -> Trace:
    """backward(retain_graph=True) at line 3 over Mm (saved weight, line 1), opt.step() at line
    4 updating that weight; optionally a later backward at line 5 through it that failed."""
    from autograd_magic.model.records import VersionBump

    w = node(1, "AccumulateGrad", 1, site(1), reached_by=0)
    mm = node(2, "MmBackward0", 2, site(1), (1,), reached_by=0)
    loss = node(3, "SumBackward0", 3, site(2), (2,), reached_by=0)
    saved = buffer(1, 2, 2, site(1))
    first = BackwardCall("backward", 4, site(3), True, create_graph, 5, root_ids=(3,))
    first.reached = (1, 2, 3)
    calls = [first]
    if later_backward:
        again = BackwardCall("backward", 7, site(5), False, False, 8, error="RuntimeError: boom")
        again.root_ids, again.reached = (3,), (1, 2, 3)
        calls.append(again)
    trace = trace_of([w, mm, loss], [saved], calls, [Holder("loss", 3)])
    trace.version_bumps = [VersionBump("w", "_foreach_add_", 0, 1, 6, site(4), hit_buffers=(1,))]
    return trace


def test_a_retained_graph_walked_again_is_not_blamed_and_the_step_is_the_cause():
    found = analyze(retained_then_step(later_backward=True))
    assert [(f.kind, f.line) for f in found] == [("inplace-on-saved", 4)]
    assert "drop retain_graph" not in found[0].message


def test_a_step_under_a_graph_nobody_backpropagates_again_is_not_said_to_fail():
    found = analyze(retained_then_step(later_backward=False))
    assert [f.kind for f in found] == ["retained-graph"]


def test_create_graph_retains_on_purpose():
    found = analyze(retained_then_step(later_backward=False, create_graph=True))
    assert "retained-graph" not in [f.kind for f in found]


def test_one_numpy_buffer_rewritten_in_a_loop_is_one_finding():
    from autograd_magic.model.records import VersionBump

    mm = node(1, "MmBackward0", 1, site(2), existed_before=True)
    bumps = [
        VersionBump("obs_buf", "numpy write", 0, 0, 2 + i, site(3), hit_buffers=(1,), bypass=True)
        for i in range(5)
    ]
    trace = trace_of([mm], [buffer(1, 1, 1, site(2))])
    trace.version_bumps = bumps
    assert [f.kind for f in analyze(trace)] == ["data-bypass"]
