"""A long watched loop (issue 34): the step records stay within their cap, the memory the watch
holds stops growing once it is reached, and a step costs the same late in the loop as early.
The full 100,000-step run is benchmark row 18 (`benchmarks/long_watch.py`)."""

from __future__ import annotations

import gc
import tracemalloc

import autograd_magic
from autograd_magic import watch_trace
from autograd_magic.model.watch import StepCounts, StepLog
from benchmarks.long_watch import records_bytes, tiny_step, watched_run


def test_the_memory_a_watch_holds_is_flat_past_its_step_cap(monkeypatch):
    """GIVEN the step-record cap at 500 WHEN 3,000 tiny steps are watched THEN at most 500
    records are kept, the first step's window and the ends included, and what tracemalloc counts
    as held grows by less than a quarter of what 1,500 more records would take."""
    monkeypatch.setattr(watch_trace, "MAX_STEPS", 500)
    step = tiny_step()
    held = {}
    gc.collect()
    tracemalloc.start()
    try:
        with autograd_magic.watch() as w:
            for i in range(1, 3001):
                step()
                if i in (1500, 3000):
                    gc.collect()
                    held[i] = tracemalloc.get_traced_memory()[0]
                    if i == 1500:
                        per_record = records_bytes(w.result) / len(w.result.steps)
    finally:
        tracemalloc.stop()
    result = w.result
    assert result.steps_done == 3000
    assert len(result.steps) <= 500
    assert result.steps[0].step == 1 and result.steps[0].captured
    assert result.steps[-1].step == 3000
    assert result.thinned == 3000 - len(result.steps)
    assert held[3000] - held[1500] < 1500 * per_record / 4, (held, per_record)


def test_a_20000_step_watch_keeps_its_step_records_capped():
    """GIVEN 20,000 tiny steps in one watched block (the real caps: records thinned past 10,000)
    THEN the records stay capped and the last step is still recorded. (That a step costs the
    same late as early is benchmark row 18's, timed there, never in a test.)"""
    run = watched_run(20_000, 1_000)
    assert run.result is not None and len(run.result.steps) <= watch_trace.MAX_STEPS
    assert run.result.steps[-1].step == run.result.steps_done == 20_000


def test_step_records_are_counted_in_bytes():
    """GIVEN a few watched steps THEN their records' bytes grow with them."""
    step = tiny_step()
    with autograd_magic.watch() as w:
        step()
        one = records_bytes(w.result)
        for _ in range(3):
            step()
    assert records_bytes(w.result) > one > 0


def test_the_step_log_reads_back_what_went_in_and_thins_as_the_list_rule_says():
    """GIVEN 300 steps (two captured) in a StepLog THEN it reads back as the StepCounts added
    (indexing, slices, columns, JSON lists, equality), and thinning past 100 keeps the first
    100, both captured steps, every other counted one and the last, as the list rule did."""
    steps = [
        StepCounts(i, 1, i % 3, 2 * i, 8 * i, 9 * i, captured=i in (150, 151))
        for i in range(1, 301)
    ]
    log = StepLog(steps)
    assert len(log) == 300 and log == steps and list(log) == steps
    assert log[-1] == steps[-1] and log[10:13] == steps[10:13]
    assert log.column("retained_bytes") == [8 * i for i in range(1, 301)]
    assert log.as_lists()[149] == [150, 1, 0, 300, 1200, 1350, True]
    rest = steps[100:]
    kept = [s for i, s in enumerate(rest) if s.captured or i % 2 == 0 or i == len(rest) - 1]
    assert log.thin(head=100) == 300 - 100 - len(kept)
    assert list(log) == steps[:100] + kept
    assert {150, 151, 300} <= {s.step for s in log}
