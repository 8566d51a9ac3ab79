"""Facts whose fix depends on what the code means (issue 35), from hand-built records: a
rollout read by every epoch vs a list never emptied, a graph freed by `torch.autograd.grad`, a
tensor cached on a module from its parameters, outputs no backward walked although training
walked the parameters under them, and the carried value as the holder of a retained graph."""

from __future__ import annotations

import dataclasses

from test_facts import FREED_TWICE, buffer, call, node, site, trace

from autograd_magic.analysis.findings import find_facts
from autograd_magic.analysis.findings.facts import (
    FreedBuiltOnce,
    FreedByGrad,
    FreedKeptContainer,
    KeptContainer,
    RetainedGraph,
)
from autograd_magic.report.wording import finding


def _rollout(*, refilled: bool):
    """`saved[i] = log_prob(x)` (line 2), `loss = sum(saved)` (line 3), `loss.backward()` (line
    4) twice; with `refilled`, the second loss also reads an element added after the first."""
    new = [node(id=3, name="LogBackward0", line=2, seq=11, reached_by=1)] if refilled else []
    return trace(
        nodes=[
            node(id=1, name="LogBackward0", line=2, seq=1, reached_by=0),
            node(id=2, name="SumBackward0", line=3, seq=2, next=[1], reached_by=0),
            *new,
            node(id=4, name="SumBackward0", line=3, seq=12, next=[1, *[3][: len(new)]]),
        ],
        buffers=[buffer(id=1, node=1, line=2, seq=1, freed_seq=6)],
        backward_calls=[
            call(seq=5, line=4, reached=[2, 1], roots=[2]),
            call(seq=15, line=4, reached=[4, 1], roots=[4], error=FREED_TWICE),
        ],
        holders={"saved[0]": 1, **({"saved[1]": 3} if refilled else {}), "loss": 4},
    )


def test_a_rollout_read_again_by_every_epoch_is_collected_without_graphs_not_emptied():
    # GIVEN a list filled once and read by two backwards one after the other (PPO's epochs)
    [fact] = find_facts(_rollout(refilled=False))
    # THEN the list is named, and the fix keeps graphs out of it instead of emptying it
    assert type(fact) is FreedKeptContainer and not fact.refilled
    message = finding(fact).message
    assert "`torch.no_grad()`" in message and "`.detach()`" in message
    assert "del saved[:]" not in message


def test_a_list_filled_again_after_the_backward_is_emptied():
    [fact] = find_facts(_rollout(refilled=True))
    assert type(fact) is FreedKeptContainer and fact.refilled
    assert "`del saved[:]`" in finding(fact).message


def test_a_graph_freed_by_autograd_grad_asks_for_create_graph():
    # GIVEN `g = torch.autograd.grad(out.sum(), x)` (line 2, no create_graph) freeing `out`'s
    # graph (line 1), then `(g.pow(2).sum() + 0 * out.sum()).backward()` (line 3)
    grad = dataclasses.replace(call(seq=5, line=2, reached=[2, 1], roots=[2]), kind="grad")
    t = trace(
        nodes=[
            node(id=1, name="AccumulateGrad", line=1, reached_by=0),
            node(id=2, line=1, next=[1], reached_by=0),
            node(id=3, name="SumBackward0", line=3, seq=10, next=[2]),
        ],
        buffers=[buffer(id=1, node=2, line=1, freed_seq=6)],
        backward_calls=[
            grad,
            call(seq=12, line=3, reached=[3, 2, 1], roots=[3], error=FREED_TWICE),
        ],
    )
    [fact] = find_facts(t)
    assert type(fact) is FreedByGrad and fact.releaser == site(2)
    message = finding(fact).message
    assert "`create_graph=True`" in message and "built once" not in message


def _built_once(holder: str):
    """`holder = w * 2` (line 1) built once from a leaf that accumulates its gradient, then
    `loss = holder.sum()` (line 3) and `loss.backward()` (line 4) twice."""
    return trace(
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
        holders={holder: 2, "loss": 4},
    )


def test_a_tensor_cached_on_a_module_from_its_parameters_is_recomputed_in_forward():
    [fact] = find_facts(_built_once("model.masked_weight"))
    assert type(fact) is FreedBuiltOnce and fact.trains
    message = finding(fact).message
    assert "inside `forward`" in message and "detach" not in message


def test_a_plain_variable_built_once_may_still_be_detached():
    [fact] = find_facts(_built_once("emb"))
    assert type(fact) is FreedBuiltOnce and not fact.trains
    assert "detach `emb`" in finding(fact).message


def test_outputs_no_backward_walked_lead_with_no_grad_though_training_walked_the_weights():
    # GIVEN a training backward (line 9) walking the weight's accumulator, then
    # `preds.append(model(x))` twice (line 2) that no backward walked
    t = trace(
        nodes=[
            node(id=1, name="AccumulateGrad", line=1, reached_by=0),
            node(id=2, line=1, next=[1], reached_by=0),
            node(id=3, line=2, seq=20, next=[1]),
            node(id=4, line=2, seq=30, next=[1]),
        ],
        buffers=[buffer(id=1, node=3, line=2, seq=20), buffer(id=2, node=4, line=2, seq=30)],
        backward_calls=[call(seq=10, line=9, reached=[2, 1], roots=[2])],
        holders={"preds[0]": 3, "preds[1]": 4},
    )
    [fact] = find_facts(t)
    assert type(fact) is KeptContainer and not fact.used
    message = finding(fact).message
    assert message.index("torch.no_grad()") < message.index(".detach()")
    assert "2.0 KiB of saved tensors included" in message and ".item()" not in message


def test_a_carried_value_is_the_holder_of_what_retain_graph_kept():
    # GIVEN `h = h @ w` (line 4) carried, `loss = h.sum()` (line 5) and
    # `loss.backward(retain_graph=True)` (line 6) twice
    t = trace(
        nodes=[
            node(id=1, name="AccumulateGrad", line=1, reached_by=0),
            node(id=2, line=4, seq=2, next=[1], reached_by=0),
            node(id=3, name="SumBackward0", line=5, seq=3, next=[2], reached_by=0),
            node(id=4, line=4, seq=12, next=[2, 1], reached_by=1),
            node(id=5, name="SumBackward0", line=5, seq=13, next=[4], reached_by=1),
        ],
        buffers=[
            buffer(id=1, node=2, line=4, seq=2),
            buffer(id=2, node=4, line=4, seq=12),
            buffer(id=3, node=5, line=5, seq=13, nbytes=8),
        ],
        backward_calls=[
            call(seq=5, line=6, reached=[3, 2, 1], roots=[3], retain=True, graph_nodes=3),
            call(
                seq=15,
                line=6,
                reached=[5, 4, 2, 1],
                roots=[5],
                retain=True,
                earlier_nodes=1,
                graph_nodes=4,
            ),
        ],
        holders={"h": 4, "loss": 5},
    )
    retained = next(f for f in find_facts(t) if isinstance(f, RetainedGraph))
    # THEN `h` holds them; dropping `loss` alone frees only its own 8 B
    assert (retained.holder, retained.root_holder, retained.root_only_bytes) == ("h", "loss", 8)
    message = finding(retained).message
    assert "as long as `h` is alive (dropping `loss` alone frees only 8 B" in message
