"""Workload 12: a 1,000-step LSTM training script, run as a user runs it.

The other overhead rows collect garbage before each timed sample (`timing.time_once`), so what
the cycle collector costs a loop is left out of them. A script does no such thing: objects that
tracking keeps alive with each step's graph survive into the oldest generation and bring the
user's full collections (tens of ms each in a process that imported torch) sooner. Here the
whole loop runs in one `track()` block with the collector as Python leaves it, and the time the
collector took is reported per variant.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

import autograd_magic
from autograd_magic.recorder import native
from benchmarks import floor
from benchmarks.overhead import events_per_step, pure_python
from benchmarks.results import Floor, Row, verdict
from benchmarks.timing import inside, interleave, ratios

TARGET = 1.5
EVENT_STEPS = 20  # steps of a tracked run counted for events per step
DETAILS = (
    "2-layer LSTM (hidden 64) over 200 tokens, seq 16, batch 8, hidden state detached each "
    "step, Adam; {steps:,} steps in one track() block (tracked) or bare, the cycle collector "
    "left on and never called"
)


def script(steps: int) -> Callable[[], None]:
    """The training loop: `run()` does `steps` steps from a fixed model and data."""
    torch.manual_seed(0)
    vocab, hidden, seq, batch = 200, 64, 16, 8
    embed, rnn, head = (
        nn.Embedding(vocab, hidden),
        nn.LSTM(hidden, hidden, 2),
        nn.Linear(hidden, vocab),
    )
    params = [*embed.parameters(), *rnn.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-3)
    tokens = torch.randint(0, vocab, (seq + 1, batch))

    def run() -> None:
        state = (torch.zeros(2, batch, hidden), torch.zeros(2, batch, hidden))
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            h, c = (t.detach() for t in state)
            out, state = rnn(embed(tokens[:-1]), (h, c))
            loss = F.cross_entropy(head(out).view(-1, vocab), tokens[1:].reshape(-1))
            loss.backward()
            optimizer.step()

    return run


def _count(n: float, noun: str) -> str:
    return f"{n:.0f} {noun}" + ("" if round(n) == 1 else "s")


class _CollectorClock:
    """Seconds spent in the cycle collector while installed (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.full += info["generation"] == 2


def _timed(run: Callable[[], object], clock: _CollectorClock) -> tuple[float, float, int]:
    gc.collect()  # untimed: each sample starts from the same heap
    before_s, before_full = clock.seconds, clock.full
    start = time.perf_counter()
    run()
    return time.perf_counter() - start, clock.seconds - before_s, clock.full - before_full


def measure(steps: int = 1000, rounds: int = 5) -> Row:
    """Interleave bare, tracked (compiled) and tracked (pure Python) runs of the script."""
    run = script(steps)

    tracked = inside(autograd_magic.track, run)
    variants = {
        "untracked": run,
        "tracked": tracked,
        "tracked_pure": pure_python(tracked),
        "mechanism": inside(floor.mechanism, run),
        "reads_only": inside(floor.reads_only, run),
    }
    clock = _CollectorClock()
    gc.callbacks.append(clock)
    try:
        script(2)()  # warm-up
        samples = interleave(variants, rounds, 0, timer=lambda run: _timed(run, clock))
    finally:
        gc.callbacks.remove(clock)
    ratio = ratios({name: [s[0] for s in runs] for name, runs in samples.items()}, "untracked")

    def median(name: str, field: int) -> float:
        return statistics.median_high(s[field] for s in samples[name])

    def collector(name: str) -> str:
        return (
            f"{name} {median(name, 0):.2f} s, of it {median(name, 1) * 1e3:.0f} ms in the "
            f"collector ({_count(median(name, 2), 'full collection')})"
        )

    ours = ratio["tracked"]
    events = events_per_step(script(EVENT_STEPS), EVENT_STEPS)
    step_ms = median("untracked", 0) * 1e3 / steps
    ours_us = (median("tracked", 0) - median("untracked", 0)) * 1e6 / steps / events
    return Row(
        key="12",
        workload="1,000-step LSTM script (collector on)",
        ours=ours.describe(),
        target=f"<= {TARGET:.2f}x",
        verdict=verdict(ours.median <= TARGET),
        details=[
            DETAILS.format(steps=steps),
            "; ".join(collector(name) for name in variants),
            f"recorder {native.STATUS}; the pure-Python recorder in the same rounds: "
            f"{ratio['tracked_pure'].describe()}; the mechanism alone (an empty "
            f"TorchFunctionMode and no-op saved-tensor hooks around the loop): "
            f"{ratio['mechanism'].describe()}; the reads alone (benchmarks/floor.py): "
            f"{ratio['reads_only'].describe()}; {events:,} recorded events per step",
        ],
        ratio=ours.median,
        floor=Floor(
            TARGET, ratio["mechanism"].median, step_ms, events, ours_us, ratio["reads_only"].median
        ),
    )
