"""Findings as typed facts, from hand-built records (no recorder runs): one test per kind
asserting the fact's class and fields, the wording table covering every class, and facts
through JSON and back worded to the very same sentences (the findings corpus included)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping

import pytest

from autograd_magic.analysis.findings import FACT_TYPES, find_facts
from autograd_magic.analysis.findings.facts import (
    DataUpdate,
    DataWrite,
    Fact,
    FreedBuiltOnce,
    FreedByTwoLosses,
    FreedCarried,
    FreedKeptContainer,
    FreedTwice,
    FreedUnshared,
    GraphGrowth,
    Growth,
    InplaceWrite,
    KeptChain,
    KeptContainer,
    Leftover,
    LibraryWrite,
    NeverReached,
    NoBackward,
    NumpyWrite,
    OptimizerStep,
    RetainedGraph,
    SavedBy,
    SharedWrite,
)
from autograd_magic.analysis.findings.serial import (
    fact_from_dict,
    fact_to_dict,
    facts_from_json_list,
    facts_to_json_list,
)
from autograd_magic.model.records import (
    AliasLink,
    BackwardCall,
    Holder,
    NodeRecord,
    SavedBuffer,
    Site,
    VersionBump,
)
from autograd_magic.model.trace import Trace
from autograd_magic.report.wording import finding, words_of

CELL = "<facts-cell>"
FREED_TWICE = (
    "RuntimeError: Trying to backward through the graph a second time (or directly access "
    "saved tensors after they have already been freed)."
)
INPLACE = (
    "RuntimeError: one of the variables needed for gradient computation has been modified by "
    "an inplace operation"
)


# ----- keyword builders --------------------------------------------------------------------
def site(line: int, file: str = CELL) -> Site:
    return Site(file, line)


def node(
    *,
    id: int,
    name: str = "MmBackward0",
    line: int,
    seq: int | None = None,
    next: Iterable[int] = (),
    freed_seq: int | None = None,
    freed_line: int | None = None,
    reached_by: int | None = None,
    existed_before: bool = False,
) -> NodeRecord:
    """A node born at `seq` (its id unless given) on cell line `line`."""
    return NodeRecord(
        id,
        name,
        id if seq is None else seq,
        site(line),
        tuple(next),
        freed_seq=freed_seq,
        freed_site=None if freed_line is None else site(freed_line),
        existed_before=existed_before,
        reached_by=reached_by,
    )


def buffer(
    *,
    id: int,
    node: int,
    line: int,
    seq: int | None = None,
    nbytes: int = 1024,
    freed_seq: int | None = None,
) -> SavedBuffer:
    """A float32 CPU tensor of `nbytes` that node `node` saved at `seq` (its node's id unless
    given), held by the graph alone."""
    return SavedBuffer(
        id,
        node,
        (nbytes // 4,),
        "float32",
        "cpu",
        nbytes,
        nbytes,
        False,
        False,
        0,
        node if seq is None else seq,
        site(line),
        storage_key=id,
        freed_seq=freed_seq,
    )


def call(
    *,
    seq: int,
    line: int,
    reached: Iterable[int] = (),
    roots: Iterable[int] = (),
    retain: bool = False,
    create_graph: bool = False,
    error: str | None = None,
    earlier_nodes: int = 0,
    graph_nodes: int = 0,
) -> BackwardCall:
    return BackwardCall(
        "backward",
        seq,
        site(line),
        retain,
        create_graph,
        seq + 1,
        error=error,
        root_ids=tuple(roots),
        reached=tuple(reached),
        earlier_nodes=earlier_nodes,
        graph_nodes=graph_nodes,
    )


def bump(
    *,
    label: str,
    op: str,
    seq: int,
    line: int,
    hit: Iterable[int] = (),
    bypass: bool = False,
    bypassed: str = "",
    sharers: Iterable[str] = (),
    file: str = CELL,
    object_id: int = 0,
    sharer_ids: Iterable[int] = (),
    hidden: bool = False,
    module: str | None = None,
) -> VersionBump:
    return VersionBump(
        label,
        op,
        0,
        0 if bypass else 1,
        seq,
        site(line, file),
        object_id=object_id,
        hit_buffers=tuple(hit),
        bypass=bypass,
        bypassed=bypassed,
        sharer_ids=tuple(sharer_ids),
        sharers=tuple(sharers),
        hidden=hidden,
        module=module,
    )


def trace(
    *,
    nodes: Iterable[NodeRecord] = (),
    buffers: Iterable[SavedBuffer] = (),
    backward_calls: Iterable[BackwardCall] = (),
    holders: Mapping[str, int] | None = None,
    version_bumps: Iterable[VersionBump] = (),
    links: Iterable[AliasLink] = (),
    labels: Mapping[int, str] | None = None,
    alive_at_end: Iterable[int] | None = None,
    module_types: Mapping[str, str] | None = None,
) -> Trace:
    """A finished trace of these records; `holders` maps a user's path to the node it holds."""
    t = Trace.from_records(
        nodes,
        buffers,
        backward_calls=list(backward_calls),
        holders=[Holder(path, i) for path, i in (holders or {}).items()],
        version_bumps=list(version_bumps),
        links=list(links),
        labels=dict(labels or {}),
        finished=True,
    )
    if alive_at_end is not None:
        t.alive_at_end = set(alive_at_end)
    t.module_types = dict(module_types or {})
    return t


def sentences(facts: Iterable[Fact]) -> list[str]:
    return [finding(f).message for f in facts]


# ----- kept-alive --------------------------------------------------------------------------
def test_a_running_total_is_a_kept_chain_naming_its_iterations_and_nodes():
    # GIVEN `total_loss += loss` (line 5) over two iterations, each loss walked by a backward
    t = trace(
        nodes=[
            node(id=1, name="MseLossBackward0", line=3, seq=5, reached_by=0),
            node(id=2, name="AddBackward0", line=5, seq=11, next=[1]),
            node(id=3, name="MseLossBackward0", line=3, seq=15, reached_by=1),
            node(id=4, name="AddBackward0", line=5, seq=21, next=[2, 3]),
        ],
        backward_calls=[call(seq=10, line=6), call(seq=20, line=6)],
        holders={"total_loss": 4},
    )
    # WHEN analysed
    [fact] = find_facts(t)
    # THEN one chain fact, with no rewritten line (the cell's source is not available)
    assert type(fact) is KeptChain and (fact.kind, fact.form) == ("kept-alive", "chain")
    assert (fact.line, fact.holder, fact.built) == (5, "total_loss", site(5))
    assert (fact.iterations, fact.node_ids, fact.fix) == (2, (1, 2, 3, 4), None)


def test_the_rewritten_line_of_a_kept_chain_is_a_typed_field(tmp_path):
    cell = tmp_path / "cell.py"
    cell.write_text("\n\n\n\ntotal_loss += loss\n")
    t = trace(
        nodes=[
            NodeRecord(1, "MseLossBackward0", 5, Site(str(cell), 3), reached_by=0),
            NodeRecord(2, "AddBackward0", 11, Site(str(cell), 5), (1,)),
            NodeRecord(3, "MseLossBackward0", 15, Site(str(cell), 3), reached_by=1),
            NodeRecord(4, "AddBackward0", 21, Site(str(cell), 5), (2, 3)),
        ],
        backward_calls=[call(seq=10, line=6), call(seq=20, line=6)],
        holders={"total_loss": 4},
    )
    [fact] = find_facts(t)
    assert isinstance(fact, KeptChain) and fact.fix == "total_loss += loss.item()"
    assert "`total_loss += loss.item()`" in finding(fact).message


def test_outputs_kept_in_a_list_no_backward_used_are_a_kept_container():
    # GIVEN `outs.append(model(x))` twice (line 2) and no backward
    t = trace(
        nodes=[
            node(id=1, name="AccumulateGrad", line=2),
            node(id=2, line=2, next=[1]),
            node(id=3, line=2, next=[1]),
        ],
        buffers=[buffer(id=1, node=2, line=2), buffer(id=2, node=3, line=2)],
        holders={"outs[0]": 2, "outs[1]": 3},
    )
    [fact] = find_facts(t)
    assert type(fact) is KeptContainer
    assert (fact.holder, fact.roots, fact.used, fact.nbytes) == ("outs", 2, False, 2048)
    assert fact.node_ids == (1, 2, 3) and fact.built == site(2)


# ----- graph-growth and retained-graph -----------------------------------------------------
def carried_state() -> Trace:
    """`h = tanh(h + x)` (line 4) carried over three iterations, each backward (line 6,
    retain_graph=True) walking every earlier iteration's node: 1, then 3, then 5 nodes."""
    return trace(
        nodes=[
            node(id=1, name="TanhBackward0", line=4, seq=5, reached_by=0),
            node(id=2, name="TanhBackward0", line=4, seq=15, next=[1], reached_by=1),
            node(id=3, name="SumBackward0", line=5, seq=16, next=[2], reached_by=1),
            node(id=4, name="TanhBackward0", line=4, seq=25, next=[2], reached_by=2),
            node(id=5, name="SumBackward0", line=5, seq=26, next=[4], reached_by=2),
        ],
        buffers=[buffer(id=1, node=1, line=4, seq=4, nbytes=4096)],
        backward_calls=[
            call(seq=10, line=6, reached=[1], retain=True, graph_nodes=1),
            call(
                seq=20,
                line=6,
                reached=[3, 2, 1],
                roots=[3],
                retain=True,
                earlier_nodes=1,
                graph_nodes=3,
            ),
            call(
                seq=30,
                line=6,
                reached=[5, 4, 2, 1],
                roots=[5],
                retain=True,
                earlier_nodes=2,
                graph_nodes=5,
            ),
        ],
        holders={"h": 4},
    )


def test_a_carried_state_is_graph_growth_and_the_retained_graph_follows_from_it():
    growth, retained = find_facts(carried_state())
    # THEN the root cause: `h` at line 4, the backward at line 6, the graph's growth in fields
    assert type(growth) is GraphGrowth and growth.cause is None
    assert (growth.line, growth.holder, growth.iterations) == (4, "h", 3)
    assert (growth.built, growth.reference) == (site(4), site(6))
    # (the backwards that reached back: 3 nodes, then 5, over 3 calls counting the first)
    assert growth.earlier_nodes == 2 and growth.grew == Growth(3, 5, 3)
    assert (growth.is_tuple, growth.retain_graph_used, growth.writes_hit_saved) == (
        False,
        True,
        False,
    )
    # AND the retained graph is its consequence: every call of line 6 counted
    assert type(retained) is RetainedGraph and retained.cause is growth
    assert (retained.line, retained.times, retained.nbytes) == (6, 3, 4096)
    # (kept by the carried `h`, whose graph reaches them, not by a rebound loss: issue 35)
    assert (retained.buffer_ids, retained.related_lines, retained.holder) == ((1,), (4,), "h")


def retained_then_step(*, later_backward: bool) -> Trace:
    """backward(retain_graph=True) at line 3 over Mm (saved weight, line 1), `opt.step()` at line
    4 updating that weight; optionally a later backward at line 5 that failed because of it."""
    calls = [call(seq=4, line=3, reached=[1, 2, 3], roots=[3], retain=True)]
    if later_backward:
        calls.append(call(seq=7, line=5, reached=[1, 2, 3], roots=[3], error=INPLACE))
    return trace(
        nodes=[
            node(id=1, name="AccumulateGrad", line=1, reached_by=0),
            node(id=2, line=1, next=[1], reached_by=0),
            node(id=3, name="SumBackward0", line=2, next=[2], reached_by=0),
        ],
        buffers=[buffer(id=1, node=2, line=1)],
        backward_calls=calls,
        holders={"loss": 3},
        version_bumps=[bump(label="w", op="_foreach_add_", seq=6, line=4, hit=[1])],
    )


def test_a_retained_graph_alone_has_no_cause_and_counts_its_calls():
    [fact] = find_facts(retained_then_step(later_backward=False))
    assert type(fact) is RetainedGraph and fact.cause is None
    assert (fact.line, fact.holder, fact.times, fact.nbytes) == (3, "loss", 1, 1024)
    assert fact.reference == site(3) and fact.buffer_ids == (1,)


# ----- backward-through-freed --------------------------------------------------------------
def two_losses() -> Trace:
    """`out = w @ x` (line 1), `loss1 = out.sum()` (line 2), `loss2 = out.mean()` (line 3),
    `loss1.backward()` (line 4) then `loss2.backward()` (line 5), which failed."""
    return trace(
        nodes=[
            node(id=1, name="AccumulateGrad", line=1, reached_by=0),
            node(id=2, line=1, next=[1], reached_by=0),
            node(id=3, name="SumBackward0", line=2, next=[2], reached_by=0),
            node(id=4, name="MeanBackward0", line=3, next=[2], reached_by=1),
        ],
        buffers=[buffer(id=1, node=2, line=1, freed_seq=11)],
        backward_calls=[
            call(seq=10, line=4, reached=[3, 2, 1], roots=[3]),
            call(seq=20, line=5, reached=[4, 2, 1], roots=[4], error=FREED_TWICE),
        ],
        holders={"loss1": 3, "loss2": 4},
    )


def test_two_losses_from_one_forward_name_the_first_loss_and_the_backward_that_freed():
    [fact] = find_facts(two_losses())
    assert type(fact) is FreedByTwoLosses and isinstance(fact, FreedTwice)
    assert (fact.kind, fact.form) == ("backward-through-freed", "two-losses")
    assert (fact.line, fact.holder, fact.first, fact.releaser) == (5, "loss2", "loss1", site(4))
    assert (fact.saved_lines, fact.built_lines, fact.related_lines) == ((1,), (1,), (1, 4))
    assert (fact.node_ids, fact.buffer_ids) == ((2,), (1,))
    assert "`(loss1 + loss2).backward()`" in finding(fact).message


def test_a_list_of_earlier_results_reaching_the_next_loss_is_named_as_the_container():
    # GIVEN `saved[i] = log_prob(x)` (line 2) each iteration, `loss = sum(saved)` (line 3) and
    # `loss.backward()` (line 4) that failed in the second iteration: `saved` was never emptied
    t = trace(
        nodes=[
            node(id=1, name="LogBackward0", line=2, seq=1, reached_by=0),
            node(id=2, name="SumBackward0", line=3, seq=2, next=[1], reached_by=0),
            node(id=3, name="LogBackward0", line=2, seq=11, reached_by=1),
            node(id=4, name="SumBackward0", line=3, seq=12, next=[1, 3], reached_by=1),
        ],
        buffers=[buffer(id=1, node=1, line=2, seq=1, freed_seq=6)],
        backward_calls=[
            call(seq=5, line=4, reached=[2, 1], roots=[2]),
            call(seq=15, line=4, reached=[4, 3, 1], roots=[4], error=FREED_TWICE),
        ],
        holders={"saved[0]": 1, "saved[1]": 3, "loss": 4},
    )
    [fact] = find_facts(t)
    assert type(fact) is FreedKeptContainer and fact.container == "saved"
    assert (fact.line, fact.holder, fact.releaser, fact.saved_lines) == (4, "loss", site(4), (2,))
    assert "`del saved[:]`" in finding(fact).message


def test_a_part_built_once_and_walked_by_every_backward_names_its_widest_variable():
    # GIVEN `emb = w * 2` (line 1) built once, then `emb.sum().backward()` (lines 3, 4) twice
    t = trace(
        nodes=[
            node(id=1, name="AccumulateGrad", line=1, reached_by=0),
            node(id=2, name="MulBackward0", line=1, next=[1], reached_by=0),
            node(id=3, name="SumBackward0", line=3, seq=5, next=[2], reached_by=0),
            node(id=4, name="SumBackward0", line=3, seq=15, next=[2], reached_by=1),
        ],
        buffers=[buffer(id=1, node=2, line=1, freed_seq=11)],
        backward_calls=[
            call(seq=10, line=4, reached=[3, 2, 1], roots=[3]),
            call(seq=20, line=4, reached=[4, 2, 1], roots=[4], error=FREED_TWICE),
        ],
        holders={"emb": 2, "loss": 4},
    )
    [fact] = find_facts(t)
    assert type(fact) is FreedBuiltOnce and fact.widest == "emb"
    assert (fact.built_lines, fact.node_ids, fact.holder) == ((1,), (2,), "loss")
    assert "detach `emb`" in finding(fact).message


def test_a_backward_sharing_nothing_recorded_is_unshared():
    # GIVEN one backward (line 3) that failed on a graph made before the block
    t = trace(backward_calls=[call(seq=1, line=3, error=FREED_TWICE)])
    [fact] = find_facts(t)
    assert type(fact) is FreedUnshared and fact.releaser is None
    assert (fact.line, fact.holder, fact.saved_lines, fact.built_lines) == (3, None, (), ())
    assert finding(fact).message.startswith("The backward at line 3 needs a graph that an earlier")


# ----- writes ------------------------------------------------------------------------------
def test_an_inplace_write_to_a_saved_tensor_names_op_saver_fix_and_the_failed_backward(
    tmp_path,
):
    cell = tmp_path / "cell.py"
    cell.write_text("\n\np.clamp_(1e-6, 1 - 1e-6)\n")
    # GIVEN sigmoid's saved output (line 2, built before the block) clamped in place at line 3,
    # then a backward at line 4 that failed with PyTorch's in-place error
    t = trace(
        nodes=[node(id=1, name="SigmoidBackward0", line=2, existed_before=True)],
        buffers=[buffer(id=1, node=1, line=2)],
        backward_calls=[call(seq=5, line=4, error=INPLACE)],
        version_bumps=[bump(label="p", op="clamp_", seq=3, line=3, hit=[1], file=str(cell))],
    )
    [fact] = find_facts(t)
    assert type(fact) is InplaceWrite
    assert (fact.line, fact.holder, fact.op, fact.failed) == (3, "p", "clamp_", 4)
    assert fact.saved == SavedBy(("SigmoidBackward0",), (), (2,))
    assert fact.fix == "p = p.clamp(1e-6, 1 - 1e-6)" and fact.buffer_ids == (1,)


def test_an_optimizer_step_under_a_retained_graph_walked_again_is_one_step_fact():
    [fact] = find_facts(retained_then_step(later_backward=True))
    assert type(fact) is OptimizerStep and fact.cause is None
    assert (fact.line, fact.holder, fact.labels, fact.failed) == (4, "w", ("w",), 5)
    assert fact.saved == SavedBy(("MmBackward0",), (), (1,))


def test_a_write_to_memory_another_tensor_shares_names_the_sharer_and_how():
    # GIVEN `b = a.view(4)` then `a.add_(1)` at line 3
    t = trace(
        version_bumps=[bump(label="a", op="add_", seq=3, line=3, sharers=["b"])],
        links=[AliasLink(2, 1, "view", True, 2, site(2))],
        labels={1: "a", 2: "b"},
    )
    [fact] = find_facts(t)
    assert type(fact) is SharedWrite
    assert (fact.line, fact.holder, fact.op, fact.sharers) == (3, "a", "add_", (("b", "view"),))


def test_writes_autograd_cannot_see_are_data_or_numpy_writes():
    # GIVEN `w.data.mul_(2)` at line 3 and a NumPy array `obs` written at line 4, both to
    # memory Mm saved at line 2
    t = trace(
        nodes=[node(id=1, line=2, existed_before=True)],
        buffers=[buffer(id=1, node=1, line=2)],
        version_bumps=[
            bump(label="mul_#3", op="mul_", seq=3, line=3, hit=[1], bypass=True, bypassed="w"),
            bump(label="obs", op="numpy write", seq=4, line=4, hit=[1], bypass=True),
        ],
    )
    data, numpy = find_facts(t)
    assert type(data) is DataWrite and (data.kind, data.form) == ("data-bypass", "data")
    assert (data.line, data.holder, data.written) == (3, "w", "w.data")
    assert type(numpy) is NumpyWrite and (numpy.holder, numpy.written) == (None, "obs")
    assert data.saved == numpy.saved == SavedBy(("MmBackward0",), (), (2,))


def test_a_write_inside_a_library_call_names_the_call_its_module_and_the_failed_backward():
    # GIVEN `a = emb.weight @ W.t()` (line 2) then `emb(idx)` at line 3, whose F.embedding
    # renormalized the weight in place (max_norm), and a backward at line 4 that failed
    t = trace(
        nodes=[node(id=1, line=2, existed_before=True)],
        buffers=[buffer(id=1, node=1, line=2)],
        backward_calls=[call(seq=5, line=4, error=INPLACE)],
        version_bumps=[
            bump(
                label="emb.weight",
                op="embedding",
                seq=3,
                line=3,
                hit=[1],
                hidden=True,
                module="emb",
            )
        ],
        module_types={"emb": "Embedding"},
    )
    [fact] = find_facts(t)
    assert type(fact) is LibraryWrite and (fact.kind, fact.form) == ("inplace-on-saved", "library")
    assert (fact.line, fact.holder, fact.call, fact.failed) == (3, "emb.weight", "embedding", 4)
    assert (fact.module, fact.module_type, fact.related_lines) == ("emb", "Embedding", (2,))
    words = finding(fact).message
    assert "max_norm" in words and "`emb.weight.clone()`" in words and "line 4 failed" in words


def test_a_manual_update_through_data_after_a_retained_backward_is_one_update_fact():
    # GIVEN two parameters Mm saved at line 2, a backward(retain_graph=True) at line 3 that
    # walked that node, then `p.data.add_(p.grad, alpha=-lr)` at line 4 writing both
    t = trace(
        nodes=[node(id=1, line=2, existed_before=True)],
        buffers=[buffer(id=1, node=1, line=2), buffer(id=2, node=1, line=2)],
        backward_calls=[call(seq=3, line=3, reached=[1], retain=True)],
        version_bumps=[
            bump(
                label="data#1",
                op="add_",
                seq=4,
                line=4,
                hit=[1],
                bypass=True,
                bypassed="net.fc.weight",
            ),
            bump(
                label="data#2",
                op="add_",
                seq=5,
                line=4,
                hit=[2],
                bypass=True,
                bypassed="net.out.weight",
            ),
        ],
    )
    retained, fact = find_facts(t)  # the retained graph is a finding of its own
    assert type(retained) is RetainedGraph
    assert type(fact) is DataUpdate and (fact.kind, fact.form) == ("data-bypass", "update")
    assert (fact.line, fact.holder, fact.labels) == (4, "net", ("net.fc.weight", "net.out.weight"))
    words = finding(fact).message
    assert "2 parameters of `net`" in words and "torch.no_grad()" in words
    assert "before the forward pass" not in words


def test_a_sharer_nobody_can_read_again_is_no_shared_write():
    # GIVEN `sd = net.state_dict()` remade each iteration (line 5) and the optimizer's write to
    # the parameter at line 3 of each next iteration: the old `sd` dies or is remade
    links = [AliasLink(10 + i, 1, "detach", True, 6 + i, site(5)) for i in range(3)]
    writes = [
        bump(
            label="w",
            op="add_",
            seq=7 + i,
            line=3,
            object_id=1,
            sharers=[f"detach#{10 + i}"],
            sharer_ids=[10 + i],
        )
        for i in range(2)
    ]
    dead = trace(version_bumps=writes, links=links, labels={1: "w"}, alive_at_end={1, 12})
    assert find_facts(dead) == []
    # AND the last one, still alive at the end, was remade per write: a temporary too
    remade = trace(version_bumps=writes, links=links, labels={1: "w"}, alive_at_end={1, 10, 11})
    assert find_facts(remade) == []
    # BUT a snapshot alive at the end with no user name is described, never by its label
    [fact] = find_facts(
        trace(version_bumps=writes[:1], links=links, labels={1: "w"}, alive_at_end={1, 10})
    )
    assert type(fact) is SharedWrite and fact.unnamed == (("detach", 5),)
    words = finding(fact).message
    assert "a tensor made by `detach` at line 5" in words and "#" not in words


# ----- unused-graph ------------------------------------------------------------------------
def test_a_forward_no_backward_followed_is_no_backward():
    # GIVEN `out = model(x)` (line 2, 4 KiB saved) and no backward
    t = trace(
        nodes=[node(id=1, name="AccumulateGrad", line=2), node(id=2, line=2, next=[1])],
        buffers=[buffer(id=1, node=2, line=2, nbytes=4096)],
        holders={"out": 2},
    )
    [fact] = find_facts(t)
    assert type(fact) is NoBackward
    assert (fact.line, fact.holder, fact.nbytes, fact.graphs) == (2, "out", 4096, 1)
    assert (fact.held, fact.holds) == (True, (("out", (0,)),))


def test_forwards_held_past_their_moment_that_never_reached_a_backward_are_never_reached():
    # GIVEN a step (lines 1-3), then a forward at line 6 (4 KiB saved) consumed at line 7,
    # twice, the first rebound at line 6 after the second was built
    t = trace(
        nodes=[
            node(id=1, name="AccumulateGrad", line=1, reached_by=0),
            node(id=2, line=1, next=[1], reached_by=0),
            node(id=3, name="SumBackward0", line=2, next=[2], reached_by=0),
            node(id=60, line=6, seq=6, next=[1], freed_seq=20, freed_line=6),
            node(id=61, name="CatBackward0", line=7, seq=7, next=[60], freed_seq=20, freed_line=6),
            node(id=62, line=6, seq=9, next=[1]),
            node(id=63, name="CatBackward0", line=7, seq=10, next=[62]),
        ],
        buffers=[
            buffer(id=1, node=2, line=1, freed_seq=5),
            buffer(id=60, node=60, line=6, nbytes=4096, freed_seq=20),
            buffer(id=62, node=62, line=6, nbytes=4096),
        ],
        backward_calls=[call(seq=4, line=3, reached=[3, 2, 1], roots=[3])],
        holders={"out": 63},
    )
    [fact] = find_facts(t)
    assert type(fact) is NeverReached
    assert (fact.line, fact.holder, fact.graphs, fact.freed_at) == (6, "out", 2, 6)
    assert (fact.held, fact.holds, fact.nbytes) == (True, (("out", (1,)),), 4096)


def test_a_partial_batch_left_in_a_running_sum_is_a_leftover():
    # GIVEN `total_loss += loss` (line 5) walked by the backward at line 6, then two more
    # results added after it and never backpropagated
    t = trace(
        nodes=[
            node(id=1, name="MseLossBackward0", line=3, seq=1, reached_by=0),
            node(id=2, name="AddBackward0", line=5, seq=2, next=[1], reached_by=0),
            node(id=3, name="MseLossBackward0", line=3, seq=11),
            node(id=4, name="AddBackward0", line=5, seq=12, next=[3]),
            node(id=5, name="MseLossBackward0", line=3, seq=13),
            node(id=6, name="AddBackward0", line=5, seq=14, next=[4, 5]),
        ],
        backward_calls=[call(seq=5, line=6, reached=[2, 1], roots=[2])],
        holders={"total_loss": 6},
    )
    [fact] = find_facts(t)
    assert type(fact) is Leftover
    assert (fact.line, fact.holder, fact.results, fact.related_lines) == (5, "total_loss", 2, (6,))
    assert fact.node_ids == (3, 4, 5, 6) and fact.reference == site(6)


# ----- the classes, the wording table, JSON ------------------------------------------------
def leaf_classes(cls: type) -> set[type]:
    subs = set(cls.__subclasses__())
    return {c for c in subs if not c.__subclasses__()} | {
        leaf for c in subs for leaf in leaf_classes(c)
    }


def test_every_form_is_listed_once_and_has_words():
    assert len(FACT_TYPES) == len(set(FACT_TYPES)) == len(leaf_classes(Fact))
    assert set(FACT_TYPES) == leaf_classes(Fact)
    assert len({(c.kind, c.form) for c in FACT_TYPES}) == len(FACT_TYPES)
    for cls in FACT_TYPES:
        assert callable(words_of(cls)), cls


def test_a_family_base_is_not_a_fact():
    with pytest.raises(TypeError, match="FreedTwice is a family of facts"):
        FreedTwice(line=1, saved_lines=(), built_lines=(), releaser=None)


def round_trip(facts: list[Fact]) -> list[Fact]:
    """Facts through JSON text and back."""
    return facts_from_json_list(json.loads(json.dumps(facts_to_json_list(facts))))


HAND_BUILT = [
    carried_state,
    two_losses,
    lambda: retained_then_step(later_backward=True),
    lambda: retained_then_step(later_backward=False),
]


@pytest.mark.parametrize("build", HAND_BUILT)
def test_loaded_facts_have_the_same_class_fields_and_sentences(build):
    facts = find_facts(build())
    data = facts_to_json_list(facts)
    assert json.loads(json.dumps(data)) == data  # plain JSON types only (no tuples, no records)
    loaded = round_trip(facts)
    assert [type(f) for f in loaded] == [type(f) for f in facts]
    assert [fact_to_dict(f) for f in loaded] == [fact_to_dict(f) for f in facts]
    assert sentences(loaded) == sentences(facts)


def test_a_loaded_list_keeps_one_cause_object():
    growth, retained = round_trip(find_facts(carried_state()))
    assert isinstance(retained, RetainedGraph) and retained.cause is growth
    assert facts_to_json_list([growth, retained])[1]["cause"] == 0


def test_a_lone_fact_carries_its_cause_nested():
    _, retained = find_facts(carried_state())
    data = json.loads(json.dumps(fact_to_dict(retained)))
    assert data["cause"]["form"] == "carried" and data["reference"]["line"] == 6
    loaded = fact_from_dict(data)
    assert isinstance(loaded.cause, GraphGrowth) and loaded.cause.grew == Growth(3, 5, 3)
    assert finding(loaded) == finding(retained)


def test_an_unknown_form_or_a_mistyped_field_is_a_clear_value_error():
    data = fact_to_dict(find_facts(two_losses())[0])
    with pytest.raises(ValueError, match="unknown finding form 'backward-through-freed'/'x'"):
        fact_from_dict({**data, "form": "x"})
    with pytest.raises(ValueError, match=r"fact\.first: expected str"):
        fact_from_dict({**data, "first": 3})
    with pytest.raises(ValueError, match=r"fact\.releaser\.line: missing"):
        fact_from_dict({**data, "releaser": {"file": CELL}})
    with pytest.raises(ValueError, match=r"facts\[0\]\.cause: 0 is not the index"):
        facts_from_json_list([{**fact_to_dict(find_facts(carried_state())[1]), "cause": 0}])


def test_every_fact_of_the_findings_corpus_words_the_same_after_json():
    """GIVEN each loop of the findings corpus (tests/findings_corpus.py) WHEN its facts go
    through JSON and back THEN they are the same classes worded to the same sentences."""
    from findings_corpus import CASES

    seen: set[type] = set()
    for name, case in sorted(CASES.items()):
        facts = find_facts(case.loop())
        loaded = round_trip(facts)
        assert [type(f) for f in loaded] == [type(f) for f in facts], name
        assert sentences(loaded) == sentences(facts), name
        for fact, again in zip(facts, loaded, strict=True):
            assert dataclasses.asdict(again) == dataclasses.asdict(fact), name
        seen.update(type(f) for f in facts)
    assert {GraphGrowth, RetainedGraph, FreedCarried, OptimizerStep, NumpyWrite} <= seen
    assert {LibraryWrite, DataUpdate} <= seen
