"""Row 18 (issue 34): a 100,000-step watched loop. The trace's memory stays flat once its caps
are reached (<= 50 MB; `WatchTrace` thins its step records past `MAX_STEPS`), and a step costs
the same at step 100,000 as at step 1,000.

A tiny training step (Linear(8, 1), SGD: a few tens of microseconds untracked), so that what the
watch adds per step, and any growth of it, is most of the time measured. The loop runs in one
`watch()` block with its defaults (the first step captured, escalation on); each chunk of steps
is timed by this thread's CPU time, and divided by the time of work the watch does not touch run
right after it (the machine's speed drifts over a run). Memory: the bytes of the step records
the watch keeps (what grows with the steps) and the process's resident memory, after each chunk.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

import autograd_magic
from autograd_magic.watch_trace import MAX_STEPS, WatchTrace
from benchmarks.results import Row, verdict

MEMORY_TARGET = 50 * 10**6
FLAT_TARGET = 1.10  # per-step cost at the end / at step 1,000
EARLY = 1_000  # per-step cost is compared from here on (the first window and warm-up behind)
SPAN = 10  # chunks whose median is a per-step cost: a shared machine's noise averages out
DETAILS = (
    "Linear(8, 1), batch 4, MSE, SGD; {steps:,} steps in one autograd_magic.watch() block "
    "(defaults: the first step captured, escalation on), no growth bug"
)


def tiny_step() -> Callable[[], None]:
    """One training step of a Linear(8, 1): the smallest real step."""
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 1)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()

    return step


def reference() -> Callable[[], None]:
    """Work a watch does not touch (ops under no_grad, no module, no backward): timed beside
    each chunk, it tells how fast the machine ran then; a shared machine's speed drifts over a
    run far more than a step's cost may."""
    weight, x = torch.randn(1, 8), torch.randn(4, 8)

    def work() -> None:
        with torch.no_grad():
            for _ in range(4):
                F.linear(x, weight).sum()

    return work


def records_bytes(result: WatchTrace) -> int:
    """Bytes of the step records a watch keeps (the `StepLog` and its rows): what grows with
    the steps; the windows' traces are fixed once their steps are over."""
    return sys.getsizeof(result.steps) + result.steps.nbytes


def rss_bytes() -> int:
    """This process's resident memory (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass
class LongRun:
    """Per-step CPU seconds of each chunk; (step, records' bytes, RSS) at each chunk's end."""

    times: list[float] = field(default_factory=list)
    reference: list[float] = field(default_factory=list)  # the same for `reference()`
    memory: list[tuple[int, int, int]] = field(default_factory=list)
    result: WatchTrace | None = None


def watched_run(steps: int, chunk: int, watched: bool = True) -> LongRun:
    """`steps` tiny steps in one block (watched or not), timed chunk by chunk."""
    step, work = tiny_step(), reference()
    run = LongRun()
    gc.collect()
    with autograd_magic.watch() if watched else contextlib.nullcontext() as w:
        for done in range(chunk, steps + 1, chunk):
            start = time.thread_time()
            for _ in range(chunk):
                step()
            run.times.append((time.thread_time() - start) / chunk)
            start = time.thread_time()
            for _ in range(chunk):
                work()
            run.reference.append((time.thread_time() - start) / chunk)
            if w is not None:
                run.memory.append((done, records_bytes(w.result), rss_bytes()))
    run.result = None if w is None else w.result
    return run


def measure(steps: int = 100_000, chunk: int = 1_000) -> Row:
    """Row 18: per-step cost early and late in a `steps`-step watched loop, and the memory its
    trace keeps."""
    untracked = statistics.median(watched_run(min(steps, 20 * chunk), chunk, False).times)
    run = watched_run(steps, chunk)
    result = run.result
    assert result is not None
    first = EARLY // chunk if steps >= 10 * EARLY else 1
    early = statistics.median(run.times[first : first + SPAN])
    late = statistics.median(run.times[-SPAN:])
    relative = [t / r for t, r in zip(run.times, run.reference, strict=True)]
    flat = statistics.median(relative[-SPAN:]) / statistics.median(relative[first : first + SPAN])
    most = max(b for _, b, _ in run.memory)
    half = [m for m in run.memory if m[0] > steps // 2]
    rss_growth = half[-1][2] - half[0][2]
    marks = [m for m in run.memory if m[0] in (EARLY, steps // 4, steps // 2, steps)]
    ok = flat <= FLAT_TARGET and most <= MEMORY_TARGET
    return Row(
        key="18",
        workload=f"{steps:,}-step watched loop",
        ours=f"step cost at the end / from step {first * chunk:,}: {flat:.2f}x; step records "
        f"{most / 1e6:.1f} MB at most",
        target=f"<= {FLAT_TARGET:.2f}x, <= {MEMORY_TARGET / 1e6:.0f} MB",
        verdict=verdict(ok),
        details=[
            DETAILS.format(steps=steps),
            f"CPU time per step, median of {SPAN} chunks of {chunk:,} steps: from step "
            f"{first * chunk:,} {early * 1e6:.1f} us, the last {SPAN} chunks "
            f"{late * 1e6:.1f} us ({late / early:.2f}x); untracked {untracked * 1e6:.1f} us. "
            "The ratio is of each chunk's time over that of work the watch does not touch (ops "
            "under no_grad) timed right after it, so the machine's drift over the run cancels",
            "step records / RSS at steps "
            + ", ".join(f"{s:,}: {b / 1e6:.2f} / {r / 1e6:.0f} MB" for s, b, r in marks)
            + f"; RSS growth over the second half {rss_growth / 1e6:+.1f} MB; "
            f"{len(result.steps):,} step records kept of {result.steps_done:,} "
            f"(thinned past MAX_STEPS {MAX_STEPS:,}), {len(result.windows)} window(s)",
        ],
    )
