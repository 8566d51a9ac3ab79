"""Counted steps (issue 34): `StepCounter`'s counters say what a loop keeps, and counting changes
nothing the user can see (values, gradients, exceptions, freeing moments, refcounts).

Every test runs twice: with the compiled pack and unpack hooks (`autograd_magic._counted`) and
with the pure-Python ones they replace, which must say and do the same."""

from __future__ import annotations

import gc
import itertools
import os
import sys
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from instrumentation import installed
from markers import marker_lines
from scenarios import Probe, Run, _freeze, assert_same, run_untracked, seed_all
from test_differential import SCENARIOS
from torch import nn

from autograd_magic.model.watch import StepCounts, StepLog
from autograd_magic.recorder import counting, native, nodes, torch_api
from autograd_magic.recorder.counting import StepCounter

line_of = marker_lines(__file__)
pytestmark = pytest.mark.filterwarnings("ignore:Error detected in:UserWarning")
COMPILED = counting._compiled


@pytest.fixture(autouse=True, params=["compiled", "pure-python"])
def hooks(request, monkeypatch):
    """The counted steps' hooks under test: the compiled ones (skipped where they were not
    built, except in CI) or the pure-Python fallback."""
    if request.param == "pure-python":
        monkeypatch.setattr(counting, "_compiled", None)
        monkeypatch.setattr(counting, "_UNPACK", counting._unpack)
    elif COMPILED is None:
        if os.environ.get("CI") and not os.environ.get(native.PURE_PYTHON_ENV):
            pytest.fail("CI builds autograd_magic._counted")
        pytest.skip("autograd_magic._counted was not built")
    return request.param


def all_installed() -> tuple:
    """What the conftest fixture compares, plus the two entry points the counter wraps."""
    return (*installed(), torch.autograd.backward, torch.autograd.grad)


def mlp() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, torch.randn(32, 8), torch.randn(32, 1)


def counted_loop(keep: str, steps: int = 4) -> list[StepCounts]:
    """An MLP loop that keeps its losses as `keep` says; the counts at each step's end."""
    model, opt, x, y = mlp()
    ends: list[StepCounts] = []
    losses, total = [], 0.0
    with StepCounter() as counter:
        for _ in range(steps):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if keep == "append":
                losses.append(loss)
            elif keep == "sum":
                total += loss
            ends.append(counter.end_step())
    return ends


# ----- what the counters say -------------------------------------------------------------------


def test_a_correct_loop_ends_every_step_alike(gc_disabled):
    """GIVEN an MLP loop keeping nothing WHEN each step ends THEN one live root (the last loss),
    nothing retained after backward, and a peak that is the step's activations."""
    ends = counted_loop("nothing")
    assert [e.live_roots for e in ends] == [1, 1, 1, 1]
    assert [e.retained_bytes for e in ends] == [0, 0, 0, 0]
    assert [e.live_saved for e in ends] == [0, 0, 0, 0]
    assert [e.backward_calls for e in ends] == [1, 1, 1, 1]
    assert [e.step for e in ends] == [0, 1, 2, 3]
    assert len({e.peak_bytes for e in ends}) == 1 and ends[0].peak_bytes > 0


@pytest.mark.parametrize("keep", ["append", "sum"])
def test_a_loop_keeping_its_losses_adds_a_live_root_each_step(keep, gc_disabled):
    """GIVEN `losses.append(loss)` or `total_loss += loss` WHEN step k ends THEN k live roots
    (the saved tensors are freed by backward: only the roots tell)."""
    ends = counted_loop(keep)
    assert [e.live_roots for e in ends] == [1, 2, 3, 4]
    assert [e.retained_bytes for e in ends] == [0, 0, 0, 0]


def test_a_carried_rnn_state_grows_the_retained_bytes(gc_disabled):
    """GIVEN an RNN state carried without detach and backward(retain_graph=True) WHEN steps end
    THEN the retained bytes grow at every step."""
    torch.manual_seed(0)
    cell, xs, h = nn.GRUCell(4, 6), torch.randn(6, 3, 4), torch.zeros(3, 6)
    with StepCounter() as counter:
        retained = []
        for t in range(6):
            h = cell(xs[t], h)
            h.pow(2).mean().backward(retain_graph=True)
            retained.append(counter.end_step().retained_bytes)
    assert all(b > a for a, b in itertools.pairwise(retained)), retained


def test_the_pile_callback_runs_once_when_forwards_pile_up_with_no_backward(gc_disabled):
    """GIVEN two counted training steps, then forwards whose outputs are kept with no backward
    WHEN the counter watches for a pile of 3 steps' worth THEN the callback runs once, during
    the 5th kept forward (a kept forward saves less than a step: `x` is one storage, counted
    once, and no loss is saved), and not at all for forwards that drop their outputs."""
    model, opt, x, y = mlp()
    calls: list[int] = []
    kept = []
    with StepCounter() as counter:
        for _ in range(2):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            counter.end_counted_step(StepLog(), 0)
        counter.watch_pile(3, lambda: calls.append(len(kept)))
        for _ in range(3):
            model(x)  # dropped at once: nothing piles up
        assert calls == []
        for _ in range(6):
            kept.append(model(x))
    assert calls == [4]  # called while the 5th was saving, with 4 in the list


def test_backward_end_callback_runs_after_each_outermost_call_even_when_it_raises(gc_disabled):
    """GIVEN a counter with on_backward_end WHEN backward, grad, a failing backward and a
    reentrant checkpoint (a backward inside backward) run THEN one call each, none nested."""
    x = torch.randn(4, requires_grad=True)
    calls: list[int] = []
    counter = StepCounter(on_backward_end=lambda: calls.append(counter.backward_calls))
    with counter:
        x.exp().sum().backward()
        torch.autograd.grad(x.sin().sum(), x)
        y = x.cos().sum()
        y.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            y.backward()
        out = torch.utils.checkpoint.checkpoint(torch.sin, x, use_reentrant=True)
        out.sum().backward()
        assert counter.end_step().backward_calls == 5
    assert calls == [1, 2, 3, 4, 5]


def test_held_now_names_line_and_top_level_module(gc_disabled):
    """GIVEN a forward in a watched block WHEN held_now() is read before backward THEN each held
    storage names the block's line and the top-level module it was saved in."""
    model, _, x, y = mlp()
    with StepCounter(sys._getframe()) as counter:
        out = model(x)  # L:forward
        loss = F.mse_loss(out, y)  # L:loss
        held = counter.held_now()
        loss.backward()
        assert counter.held_now() == []
    by_module = {(h.module, h.line) for h in held if h.held_by == ""}
    assert by_module == {("Sequential", line_of("forward")), ("", line_of("loss"))}
    assert sum(h.nbytes for h in held if h.held_by == "") == counter.end_step().peak_bytes
    assert {h.held_by for h in held} == {"", "parameter"}  # addmm saves weight.t()


def test_a_block_frame_set_after_install_is_read(gc_disabled):
    """GIVEN a counter whose block frame is set only after install (watch mode finds it at the
    first step's end) WHEN tensors are saved THEN they name the frame's line from then on."""
    x = torch.ones(3, requires_grad=True)
    with StepCounter() as counter:
        before = x.exp()
        counter.block_frame = sys._getframe()
        after = x.exp()  # L:after
        lines = sorted(h.line for h in counter.held_now())
        del before, after
    assert lines == [0, line_of("after")]


def test_a_compiled_module_runs_as_untracked(gc_disabled):
    """GIVEN a torch.compile'd module WHEN it trains counted THEN no warning about global module
    hooks (untracked has none), the same gradients, and its top-level module is named."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(3, 4)
    compiled(x).sum().backward()
    expected = model[0].weight.grad.clone()
    model.zero_grad()
    with warnings.catch_warnings(record=True) as seen, StepCounter() as counter:
        warnings.simplefilter("always")
        out = compiled(x).sum()
        modules = {h.module for h in counter.held_now()}
        out.backward()
    assert [str(w.message) for w in seen] == []
    assert torch.equal(expected, model[0].weight.grad)
    assert "Sequential" in modules


def test_a_second_threads_backward_is_not_counted(gc_disabled):
    """GIVEN a counter installed on this thread WHEN another thread runs forward and backward
    THEN nothing of it is counted, and its own results are right."""
    x = torch.randn(4, requires_grad=True)
    result = {}

    def other() -> None:
        y = (x * 2).exp().sum()
        result["grad"] = torch.autograd.grad(y, x)[0]

    with StepCounter() as counter:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        counts = counter.end_step()
    assert counts.backward_calls == 0 and counts.live_roots == 0 and counts.peak_bytes == 0
    assert torch.equal(result["grad"], 2 * (x * 2).exp().detach())


# ----- counting changes nothing the user can see -----------------------------------------------


def run_counted(scenario, seed: int = 0) -> Run:
    """`scenarios.run_tracked`, with a StepCounter in place of `track()`."""
    probe = Probe()
    seed_all(seed)
    results, error = None, None
    try:
        with StepCounter(sys._getframe()):
            results = scenario(probe)
    except BaseException as exc:
        error = (type(exc).__name__, str(exc))
    kept = _freeze(results)
    results = None
    return Run(kept, error, probe.log, probe.alive())


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_counting_changes_nothing_the_user_can_see(scenario, gc_disabled):
    """GIVEN a differential scenario WHEN it runs untracked and counted with the same seed THEN
    results, gradients, exceptions and freeing moments are identical."""
    run_untracked(scenario)  # warm-up
    plain = run_untracked(scenario)
    counted = run_counted(scenario)
    assert counted.error == plain.error
    assert counted.log == plain.log
    assert_same(plain.results, counted.results)
    assert counted.alive_after == plain.alive_after


def test_without_torchs_sequence_counter_the_probe_gives_the_same_run(monkeypatch, gc_disabled):
    """GIVEN a torch without `_get_sequence_nr` (older releases) WHEN scenarios saving outputs
    and inputs run counted THEN the same results and freeing moments (no trap-1 cycle)."""
    monkeypatch.setattr(torch_api, "current_sequence_nr_peek", None)
    monkeypatch.setattr(nodes, "_peek_sequence_nr", None)  # the probe node, as the recorder's
    for scenario in SCENARIOS[:8]:
        run_untracked(scenario)  # warm-up
        plain = run_untracked(scenario)
        counted = run_counted(scenario)
        assert (counted.error, counted.log) == (plain.error, plain.log), scenario.__name__
        assert_same(plain.results, counted.results)


def _saved_input_refcount(counter: StepCounter | None) -> tuple[int, int]:
    x = torch.randn(5, requires_grad=True)
    h = x * 2  # a non-leaf input that sin saves whole
    if counter is not None:
        counter.install()
    try:
        y = h.sin()
        counts = sys.getrefcount(h), torch_api.tensor_use_count(h) or 0
        del y
    finally:
        if counter is not None:
            counter.remove()
    return counts


def test_saved_inputs_keep_their_refcount_and_use_count(gc_disabled):
    """GIVEN a saved non-leaf input WHEN saved counted THEN its refcount and C++ use count are
    what they are untracked."""
    assert _saved_input_refcount(StepCounter()) == _saved_input_refcount(None)


def test_inplace_error_reads_as_pytorchs(gc_disabled):
    """GIVEN a saved output modified in place WHEN backward runs counted THEN PyTorch's own
    error, word for word."""

    def run() -> str:
        x = torch.ones(3, requires_grad=True)
        e = x.exp()
        e.add_(1)
        with pytest.raises(RuntimeError) as error:
            e.sum().backward()
        return str(error.value)

    plain = run()
    with StepCounter():
        counted = run()
    assert counted == plain and "modified by an inplace operation" in plain


@pytest.mark.parametrize("peek", ["torch's", "probe node"])
def test_a_dropped_graph_dies_at_once(peek, monkeypatch, gc_disabled):
    """GIVEN saved outputs (exp; norm saves its input, then its output) and a carried activation
    WHEN the graph is dropped unused THEN its nodes and the activation die at the same moment as
    untracked (no cycle, no delay), also where the sequence number comes from a probe node."""
    if peek == "probe node":
        monkeypatch.setattr(torch_api, "current_sequence_nr_peek", None)
        monkeypatch.setattr(nodes, "_peek_sequence_nr", None)

    def run() -> list[str]:
        probe = Probe()
        x = torch.randn(5, requires_grad=True)
        a = probe.watch("activation", (x * 3).exp())
        norm = (a * 2).norm()
        probe.watch_graph("norm", norm)
        out = a.exp().sum() + norm
        probe.watch_graph("graph", out)
        del norm
        del a
        probe.check("dropped name")
        del out
        probe.check("dropped graph")
        return probe.log

    plain = run()
    with StepCounter():
        counted = run()
    assert counted == plain
    assert ("at", "dropped graph", ()) in plain


def test_torch_func_transforms_still_run(gc_disabled):
    """GIVEN torch.func.grad (which refuses saved-tensor hooks) WHEN called counted THEN it runs
    as untracked, and the hooks are back afterwards."""
    x = torch.randn(4)
    expected = torch.func.grad(lambda t: t.sin().sum())(x)
    with StepCounter() as counter:
        got = torch.func.grad(lambda t: t.sin().sum())(x)
        y = torch.randn(3, requires_grad=True).exp().sum()
        assert counter.live_saved == 1
        del y
    assert torch.equal(expected, got)


# ----- install and remove ----------------------------------------------------------------------


def test_remove_takes_everything_out_and_is_idempotent():
    """GIVEN an installed counter WHEN removed (twice) THEN nothing of it is left."""
    before = all_installed()
    counter = StepCounter()
    counter.install()
    assert all_installed() != before
    counter.remove()
    counter.remove()
    assert all_installed() == before


def test_an_exception_in_the_block_removes_everything():
    """GIVEN a block that raises mid-backward WHEN it ends THEN the same error, nothing left."""
    before = all_installed()
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not require grad"), StepCounter():
        torch.ones(2).sum().backward()
    with pytest.raises(ValueError, match="boom"), StepCounter():
        x.exp()
        raise ValueError("boom")
    assert all_installed() == before


def test_tags_left_on_nodes_report_to_no_dead_counter(gc_disabled):
    """GIVEN roots tagged by a counter now removed and gone WHEN their graphs die THEN nothing is
    reported (no unraisable error)."""
    unraisable = []
    old, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        x = torch.ones(2, requires_grad=True)
        counter = StepCounter()
        with counter:
            loss = x.exp().sum()
            loss.backward(retain_graph=True)
            live = x.sin().sum()
        del counter
        gc.collect()
        del loss, live
    finally:
        sys.unraisablehook = old
    assert unraisable == []


def test_a_patch_on_top_survives_removal_and_counting_resumes(gc_disabled):
    """GIVEN another tool wrapping torch.autograd.backward over ours WHEN the counter is removed
    and a new one installed THEN the tool's wrapper stays, calls reach torch, nothing recurses,
    and the new counter counts through the tool's wrapper."""
    original = torch.autograd.backward
    seen = []
    counter = StepCounter()
    counter.install()
    ours = torch.autograd.backward

    def theirs(*args, **kwargs):
        seen.append("theirs")
        return ours(*args, **kwargs)

    torch.autograd.backward = theirs
    try:
        counter.remove()
        assert torch.autograd.backward is theirs
        x = torch.ones(2, requires_grad=True)
        x.exp().sum().backward()
        with StepCounter() as again:
            x.sin().sum().backward()
            assert torch.autograd.backward is theirs
            assert again.end_step().backward_calls == 1
        assert seen == ["theirs", "theirs"]
    finally:
        torch.autograd.backward = ours  # the tool restores what it wrapped
    with StepCounter():  # an install and removal puts torch's own back
        pass
    assert torch.autograd.backward is original


def test_a_full_recording_inside_a_counted_block_leaves_the_counter_working(gc_disabled):
    """GIVEN a counter WHEN a `track()` block runs inside it (a captured window) and ends THEN
    the counter counts on, and its removal leaves nothing installed."""
    import autograd_magic as am

    before = all_installed()
    model, _, x, y = mlp()
    with StepCounter() as counter:
        with am.track():
            F.mse_loss(model(x), y).backward()
        counter.end_step()
        loss = F.mse_loss(model(x), y)
        assert {h.module for h in counter.held_now()} == {"Sequential", ""}
        loss.backward()
        counts = counter.end_step()
    assert (counts.backward_calls, counts.live_roots, counts.retained_bytes) == (1, 1, 0)
    assert counts.peak_bytes > 0
    assert all_installed() == before


def test_the_wrappers_bind_arguments_as_torchs_own():
    """GIVEN the counter's wrappers in torch.autograd WHEN a tool binds a call's arguments by
    the function's signature THEN it gets torch's parameter names."""
    import inspect

    with StepCounter():
        bound = inspect.signature(torch.autograd.grad).bind(1, 2, retain_graph=True)
        assert bound.arguments == {"outputs": 1, "inputs": 2, "retain_graph": True}
        assert "grad_tensors" in inspect.signature(torch.autograd.backward).parameters
