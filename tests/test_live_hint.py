"""The live growth hint (issue 35, class 9: "the live hint comes too late"): on every growth bug
of the findings corpus it speaks by the 4th step after the growth starts, read live as the
panel reads it; on every correct loop it never speaks, read at every step end.

The corpus's own growth bugs run 3 steps: each is timed on its `live_loops` variant of 12
steps (or, for a family whose loop is long enough, on the loop itself). A growth-kind case that
is no growth of graphs from step to step says why in `NOT_STEP_GROWTH`. The correct loops are
the corpus's (every family's), each run again and again in one block until 20 backward calls
have ended, and the 17 shapes of `tests/test_real_loops.py` with 30 batches, for 20 steps or
more.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

import findings_corpus
import live_loops
import pytest
import test_real_loops
import torch
import torch.nn.functional as F
from corpus_base import Case

import autograd_magic as am
from autograd_magic.analysis.live import MAX_PERIOD, loop_period, node_growth, step_ends
from autograd_magic.model.records import Site
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import ACCUMULATE_GRAD

BY = 4  # steps after the growth's start by which the hint speaks
STEPS = 20  # backward calls a correct loop runs, at least
GROWTH_KINDS = {"graph-growth", "kept-alive", "retained-graph"}

LONGER = {  # corpus case -> its variant in live_loops.BUGS
    "total-loss": "total-loss",
    "loss-history": "loss-history",
    "logger": "logger",
    "running-stat": "running-stat",
    "word-lm-retain-graph": "carried-state",
    "word-lm-old-sgd-no-detach": "word-lm-old-sgd",
    "hidden-retain-graph": "hidden-retain-graph",
    "hook-features-kept": "hook-features-kept",
    "multitask-retain-each": "multitask-retain-each",
}
NO_STEP = (
    "its graphs pile up in a loop that makes no backward call: no step ends while they grow "
    "(the block's end names what holds them)"
)
NOT_STEP_GROWTH = {
    "single-loss-retain": "retain_graph=True on a loss assigned again at every step: each "
    "graph dies when `loss` is, nothing piles up",
    "actor-critic-shared-trunk": "retain_graph=True keeps the graph for the critic's backward "
    "in the same step, which frees it: nothing piles up",
    "maml-fast-weights-carried": "the second task's backward fails (backward through the graph "
    "a second time): the loop stops before anything piles up",
    "kept-logits": NO_STEP,
    "eval-collect-with-grad": NO_STEP,
    "generate-without-no-grad": NO_STEP,
}


# ----- reading the hint ---------------------------------------------------------------------
class _Listened:
    """`autograd_magic` as a loop's module sees it, with a live listener on every `track()`
    called at every torch call: the backward calls done whenever the hint spoke."""

    def __init__(self) -> None:
        self.spoke: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(am, name)

    def track(self, *args: Any, **kwargs: Any) -> Any:
        recorder = am.track(*args, **kwargs)
        recorder.listen(self._hear, 0.0)
        return recorder

    def _hear(self, trace: Trace) -> None:
        calls = len(trace.backward_calls)
        if node_growth(trace) is not None and calls not in self.spoke:
            self.spoke.append(calls)


def live_run(loop: Callable[[], am.Trace], monkeypatch: pytest.MonkeyPatch) -> tuple[Trace, int]:
    """Run `loop` with the hint read live; its trace and the first step (loop iterations, 1-based)
    at which the hint spoke (0: never)."""
    listened = _Listened()
    monkeypatch.setattr(sys.modules[loop.__module__], "am", listened)
    trace = loop()
    assert len(trace.backward_calls) >= 2, "no steps to read"
    # Read at every step end after the block, the hint says the same (it reads only records
    # up to the latest step end).
    assert (listened.spoke or [0])[0] == (hint_calls(trace) or [0])[0]
    return trace, step_of(trace, listened.spoke[0]) if listened.spoke else 0


def hint_calls(trace: Trace) -> list[int]:
    """The backward calls done at each step end where the hint speaks, read after the block on
    a view of the trace cut at that step end."""
    view = Trace.from_records(
        trace.nodes, trace.buffers, trace.timeline, dropped_nodes=trace.dropped_nodes
    )
    spoke = []
    for done in range(1, len(trace.backward_calls) + 1):
        view.backward_calls = trace.backward_calls[:done]
        if node_growth(view) is not None:
            spoke.append(done)
    return spoke


def step_of(trace: Trace, calls: int) -> int:
    """The loop iteration (1-based) that backward call `calls` belongs to."""
    ends = step_ends(trace.backward_calls)
    period = loop_period([c.site for c in ends])
    return -(-sum(c in ends for c in trace.backward_calls[:calls]) // period)


def growth_start(trace: Trace) -> int:
    """In hindsight: the first step (1-based) that built nodes still alive at the block's end,
    when nodes of two steps before the last two are (0: none)."""
    ends = [c.end_seq or 0 for c in trace.backward_calls]
    steps = {
        step_of(trace, 1 + sum(end < n.born_seq for end in ends))
        for n in trace.nodes
        if n.freed_seq is None and not n.existed_before and n.name != ACCUMULATE_GRAD
    }
    old = sorted(s for s in steps if s <= step_of(trace, len(ends)) - 2)
    return old[0] if len(old) >= 2 else 0


# ----- growth bugs ----------------------------------------------------------------------------
def _growth_cases() -> list[Case]:
    return [c for c in findings_corpus.BROKEN if GROWTH_KINDS & {e.kind for e in c.expected}]


@pytest.mark.parametrize("case", _growth_cases(), ids=lambda c: c.name)
def test_the_hint_speaks_within_four_steps_of_a_corpus_growth_bug(case, monkeypatch):
    """GIVEN a growth bug of the corpus (its longer variant where its loop is short) WHEN it
    runs under a live listener THEN the hint speaks by step start + 4; a growth-kind case that
    keeps no graph from step to step never gets it."""
    if case.name in NOT_STEP_GROWTH:
        trace = case.loop()
        assert hint_calls(trace) == [], NOT_STEP_GROWTH[case.name]
        return
    if case.name in LONGER:
        bug = live_loops.BUGS[LONGER[case.name]]
        trace, spoke = live_run(bug.loop, monkeypatch)
        start = bug.start
    else:
        trace, spoke = live_run(case.loop, monkeypatch)
        start = growth_start(trace)
        last = step_of(trace, len(trace.backward_calls))
        assert start and last >= start + BY, (
            f"{case.name}: {last} steps, growth from step {start}: too short to time the hint; "
            "add a longer variant to live_loops.BUGS and LONGER, or a reason to NOT_STEP_GROWTH"
        )
    assert 0 < spoke <= start + BY, (start, spoke)


@pytest.mark.parametrize("name", sorted(live_loops.BUGS))
def test_the_hint_speaks_within_four_steps_of_a_long_growth_bug(name, monkeypatch):
    """GIVEN a 12-step loop keeping its graphs from step `start` WHEN it runs under a live
    listener THEN the hint speaks by step start + 4, and not before the growth started."""
    bug = live_loops.BUGS[name]
    trace, spoke = live_run(bug.loop, monkeypatch)
    assert bug.start < spoke <= bug.start + BY, spoke
    assert growth_start(trace) in (bug.start, bug.start + 1)  # kept after its own backward


# ----- correct loops ----------------------------------------------------------------------------
class _CountedOnly:
    """`autograd_magic` as a corpus loop sees it, with `track()` recording nothing: the loop
    runs inside one outer block."""

    def __getattr__(self, name: str) -> Any:
        return getattr(am, name)

    @staticmethod
    def track(*args: Any, **kwargs: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _tracked_until(steps: int, run: Callable[[], object]) -> Trace:
    """`run()` again and again in one tracked block until `steps` backward calls have ended."""
    with am.track() as trace:
        while len(trace.backward_calls) < steps:
            before = len(trace.backward_calls)
            run()
            if len(trace.backward_calls) == before:
                break
    return trace


@pytest.mark.parametrize("case", findings_corpus.CORRECT, ids=lambda c: c.name)
def test_the_hint_never_speaks_on_a_correct_corpus_loop(case, monkeypatch, capsys):
    """GIVEN a correct loop of the corpus WHEN run again and again in one block for 20 steps
    or more THEN the hint speaks at no step end."""
    monkeypatch.setattr(sys.modules[case.loop.__module__], "am", _CountedOnly())
    trace = _tracked_until(STEPS, case.loop)
    assert hint_calls(trace) == []


COUNTS_ITS_BATCHES = {"batchnorm_dropout_train_step"}  # asserts it ran 3: repeated instead


@pytest.mark.parametrize(
    "loop", test_real_loops.CORRECT, ids=[f.__name__ for f in test_real_loops.CORRECT]
)
def test_the_hint_never_speaks_on_a_correct_real_loop(loop, monkeypatch):
    """GIVEN a correct loop shape of test_real_loops, its batches 30 long WHEN tracked for 20
    steps or more THEN the hint speaks at no step end."""
    batches = test_real_loops.batches
    if loop.__name__ not in COUNTS_ITS_BATCHES:
        monkeypatch.setattr(test_real_loops, "batches", lambda n=3: batches(n * 10))
    monkeypatch.setattr(test_real_loops, "am", _CountedOnly())
    assert hint_calls(_tracked_until(STEPS, loop)) == []


# ----- the rule's parts -------------------------------------------------------------------------
def test_a_step_is_one_loop_iteration_read_from_the_backward_calls_lines():
    a, b, c = (Site("<cell>", line) for line in (3, 7, 9))
    assert loop_period([a] * 6) == 1
    assert loop_period([a, b, c] * 3) == 3  # DCGAN: D on real, D on fake, G
    assert loop_period([a, b, c, a, b]) == 3  # a step not yet over
    assert loop_period([a] * 5 + [b] + [a] * 5 + [b]) == 6  # WGAN-GP: 5 critic steps, then G
    assert loop_period([a, b, b, a, c, a, b, c, c, b, a, c] * 2) == MAX_PERIOD  # none: the slowest


def test_one_graph_kept_once_and_one_held_until_the_next_evaluation_are_no_growth():
    """GIVEN a loop keeping its first loss for the end, and an evaluation output computed with
    grad every 3 steps and held until the next (wasteful, but bounded) WHEN it runs 12 steps
    THEN the hint never speaks: each is one step's graph, not a pile."""
    model, opt, data = live_loops.mlp_data()
    x_val = torch.randn(8, 6)
    with am.track() as trace:
        first_loss = None
        for step, (x, y) in enumerate(data):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            first_loss = loss if first_loss is None else first_loss
            if step % 3 == 0:
                val_out = model(x_val)
    assert hint_calls(trace) == []
    del first_loss, val_out


def test_the_hint_goes_on_once_the_node_records_stop_at_their_cap():
    """GIVEN a loop keeping every loss whose node records reach their cap at step 5 WHEN it runs
    40 steps THEN the hint speaks from step 4 at every step end: the last steps recorded, then
    the live-node count rising at each of the last 16 step ends."""
    model, opt, data = live_loops.mlp_data(40)
    with am.track(trace=am.Trace(max_records=60)) as trace:
        losses = []
        for x, y in data:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss)
    assert trace.dropped_nodes
    assert hint_calls(trace) == list(range(4, 41))
