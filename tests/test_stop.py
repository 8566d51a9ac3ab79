"""Issue 19: Jupyter's Stop (SIGINT) stops a tracked training loop as it stops an untracked one.

Each try runs in a fresh Python process, so the real default SIGINT handler and CPython's
"Exception ignored" printing behave as in a kernel.
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import functools
import json
import operator
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import autograd_magic as am

TRIES = 50

_CHILD = r"""
import json, os, random, signal, sys, threading, time
import torch
sys.path.insert(0, "tests")
from instrumentation import installed
import autograd_magic as am
from autograd_magic.views.text import render_text

tries, seed = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(1)
lstm = torch.nn.LSTM(16, 48, num_layers=2, batch_first=True)
head = torch.nn.Linear(48, 1)
optimizer = torch.optim.SGD([*lstm.parameters(), *head.parameters()], lr=0.01)
x, target = torch.randn(8, 24, 16), torch.randn(8, 1)


def train_step():
    out, _ = lstm(x)
    loss = ((head(out[:, -1]) - target) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


rng = random.Random(seed)
baseline = installed()
for attempt in range(tries):
    print(f"TRY {attempt}", file=sys.stderr, flush=True)
    killed = []

    def kill():
        killed.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(rng.uniform(0.0, 0.3), kill)
    recorder, trace, outcome = am.track(), None, {}
    try:
        timer.start()
        start = time.perf_counter()
        with recorder as trace:
            # About 10 s of training; a try whose interrupt was lost gives up 1.5 s after it.
            while time.perf_counter() - start < 10.0:
                train_step()
                if killed and time.perf_counter() - killed[0] > 1.5:
                    break
        outcome["stopped"] = False
    except KeyboardInterrupt:
        outcome["latency_ms"] = (time.perf_counter() - killed[0]) * 1000
        outcome["stopped"] = True
    timer.join()
    time.sleep(0.05)  # an interrupt re-delivered late would land here, outside any try
    outcome["clean"] = installed() == baseline
    outcome["entered"] = trace is not None
    outcome["error"] = recorder.trace.error
    try:
        outcome["readable"] = "autograd_magic trace" in render_text(recorder.trace.report())
    except Exception as error:
        outcome["readable"] = repr(error)
    print(json.dumps(outcome), flush=True)
"""


def _run_tries(tries: int, seed: int) -> list[dict]:
    """Run the child; each try's outcome plus the 'Exception ignored' lines printed during it."""
    command = [sys.executable, "-c", _CHILD, str(tries), str(seed)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    if done.returncode == -signal.SIGABRT and any(_aborts_untracked(tries, seed) for _ in range(3)):
        # torch 2.4.1 and 2.8.0 (this LSTM loop): random SIGINTs corrupt the heap untracked too
        # (not at every run: the untracked loop gets three).
        pytest.skip(f"torch {torch.__version__} aborts under these interrupts untracked too")
    outcomes = [json.loads(line) for line in done.stdout.splitlines()]
    ignored: dict[int, int] = {}
    current = -1
    for line in done.stderr.splitlines():
        if line.startswith("TRY "):
            current = int(line.split()[1])
        elif line.startswith("Exception ignored"):
            ignored[current] = ignored.get(current, 0) + 1
    assert len(outcomes) == tries, done.stderr[-3000:]
    for index, outcome in enumerate(outcomes):
        outcome["ignored"] = ignored.get(index, 0)
    return outcomes


def _aborts_untracked(tries: int, seed: int) -> bool:
    """True when the same loop, under the same interrupts with no block, aborts the process."""
    untracked = _CHILD.replace("am.track(), None, {}", "contextlib.nullcontext(), True, {}")
    untracked = "import contextlib\n" + untracked.split('    outcome["error"]')[0]
    command = [sys.executable, "-c", untracked, str(tries), str(seed)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    return done.returncode == -signal.SIGABRT


def test_sigint_at_any_moment_of_a_tracked_training_loop_stops_it_within_a_second():
    """GIVEN a tracked LSTM training loop that would run for 10 s
    WHEN SIGINT arrives at a random moment in its first 300 ms (50 tries)
    THEN each try raises KeyboardInterrupt out of the block within 1 s, prints no 'Exception
    ignored', leaves nothing installed, and its trace renders and records the interrupt."""
    outcomes = _run_tries(TRIES, seed=19)
    failed = [
        outcome
        for outcome in outcomes
        if not outcome["stopped"]
        or outcome["latency_ms"] > 1000
        or outcome["ignored"]
        or not outcome["clean"]
        or outcome["readable"] is not True
        or (outcome["entered"] and not (outcome["error"] or "").startswith("KeyboardInterrupt"))
    ]
    latencies = [o["latency_ms"] for o in outcomes if o["stopped"]]
    worst = max(latencies, default=0.0)
    summary = f"{TRIES - len(failed)}/{TRIES} stopped within 1 s, max latency {worst:.0f} ms"
    assert not failed, f"{summary}; failed: {failed}"


# ----- an interrupt held in a finalizer, deterministically -----------------------------------
@contextlib.contextmanager
def _usr1_interrupts() -> Iterator[None]:
    """SIGUSR1 raises KeyboardInterrupt, as SIGINT does (a stray one cannot end the session)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _interrupt_then_free(holder: list) -> None:
    """Deliver the interrupt, then free what `holder` holds, with no bytecode of this frame in
    between: the interrupt lands on the first instruction of the first finalizer that runs."""
    calls = [functools.partial(_thread.interrupt_main, signal.SIGUSR1), holder.clear]
    collections.deque(map(operator.methodcaller("__call__"), calls), maxlen=0)


@pytest.mark.parametrize(
    "make",
    [torch.exp, lambda x: x + 1],
    ids=["a node and a saved buffer", "a node tag alone (saves nothing)"],
)
def test_an_interrupt_landing_in_a_finalizer_is_raised_by_the_next_torch_call(make):
    """GIVEN a tracked graph freed just as an interrupt arrives (it lands in our finalizer: the
    saved buffer's, or the node tag's when the node saved nothing)
    WHEN the block makes its next torch call
    THEN that call raises the KeyboardInterrupt, nothing is printed as ignored, and the trace
    still saw the graph die."""
    x = torch.ones(3, requires_grad=True)
    reached = []
    with _usr1_interrupts(), pytest.raises(KeyboardInterrupt), am.track() as trace:
        holder = [make(x)]
        _interrupt_then_free(holder)
        reached.append("after the free")
        torch.ones(1)
        reached.append("after the next torch call")
    assert reached == ["after the free"]
    assert trace.error is not None and trace.error.startswith("KeyboardInterrupt")
    assert trace.live_nodes == 0 and all(b.freed_seq is not None for b in trace.buffers)
    time.sleep(0.05)  # nothing is re-delivered later: it was raised once


def test_an_interrupt_landing_in_a_finalizer_as_the_block_ends_leaves_the_block():
    """GIVEN an interrupt landing in our finalizer as the last statement of a block
    WHEN the block ends THEN the block raises it once, and records it."""
    x = torch.ones(3, requires_grad=True)
    with _usr1_interrupts(), pytest.raises(KeyboardInterrupt), am.track() as trace:
        holder = [x.exp()]
        _interrupt_then_free(holder)
    assert trace.error is not None and trace.error.startswith("KeyboardInterrupt")
    time.sleep(0.05)


def test_an_interrupt_landing_in_a_finalizer_before_pure_python_code_is_redelivered():
    """GIVEN an interrupt landing in our finalizer, followed by Python code making no torch call
    WHEN that code runs on THEN the KeyboardInterrupt reaches it within a few milliseconds."""
    x = torch.ones(3, requires_grad=True)
    start = time.perf_counter()
    with _usr1_interrupts(), pytest.raises(KeyboardInterrupt), am.track():
        holder = [x.exp()]
        _interrupt_then_free(holder)
        start = time.perf_counter()
        while time.perf_counter() - start < 2.0:
            pass
    assert time.perf_counter() - start < 0.5
