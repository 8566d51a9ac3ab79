# The loops keep their sources' own style (zip without strict=), as the findings corpus does.
# ruff: noqa: B905
"""Escalation on a corpus (issue 34): under `watch(first=0)` (nothing captured but what the
counters ask for), each growth bug of 30 steps opens a capture window within 10 steps of the
step where it starts, and that window's findings name what holds the graphs; a correct loop
run for 30 steps never opens one.

The growth bugs are the findings corpus's broken loops (`tests/findings_corpus.py`, which names
where each came from) run for 30 steps, plus one whose bug starts at step 11. The correct loops
are the 17 shapes of `tests/test_real_loops.py` and the correct loops of the findings corpus,
each repeated until 30 steps have ended in one watched block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import findings_corpus
import live_loops
import pytest
import test_real_loops
import torch
import torch.nn as nn
import torch.nn.functional as F

import autograd_magic as am
from autograd_magic.watch_trace import WatchTrace

STEPS = 30
WITHIN = 10  # steps from the bug's start to its window's first step


def mlp_data(n: int = STEPS):
    """The findings corpus's MLP, optimizer and `n` batches (`live_loops.mlp_data`)."""
    return live_loops.mlp_data(n)


# ===== growth bugs: (result, the step where the growth starts, the holder) ====================
def loss_history() -> WatchTrace:
    # discuss.pytorch.org "Memory leak when appending loss to a list" (losses.append(loss))
    model, opt, data = mlp_data()
    with am.watch(first=0) as w:
        losses = []
        for x, y in data:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss)
    return w.result


def total_loss_tensor() -> WatchTrace:
    # discuss.pytorch.org "CUDA memory continuously increases" (total_loss += loss)
    model, opt, data = mlp_data()
    with am.watch(first=0) as w:
        total_loss = 0
        for x, y in data:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total_loss += loss
    return w.result


class Trainer:
    """A trainer object that keeps `self.loss` and a per-step dict of it (Lightning-style
    hand-rolled trainers; discuss.pytorch.org "memory leak storing self.loss")."""

    def __init__(self) -> None:
        self.model, self.opt, self.data = mlp_data()
        self.loss = None
        self.history: dict[int, Any] = {}

    def train_step(self, step: int, x, y) -> None:
        self.opt.zero_grad()
        self.loss = F.mse_loss(self.model(x), y)
        self.loss.backward()
        self.opt.step()
        self.history[step] = self.loss


def self_loss_in_a_dict() -> WatchTrace:
    trainer = Trainer()
    with am.watch(first=0) as w:
        for step, (x, y) in enumerate(trainer.data):
            trainer.train_step(step, x, y)
    return w.result


def logger_keeps_loss() -> WatchTrace:
    # findings corpus logger_keeps_loss: a logger called with the loss tensor, not loss.item()
    model, opt, data = mlp_data()
    logger = findings_corpus.Logger()
    with am.watch(first=0) as w:
        for x, y in data:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            logger.log(loss)
    return w.result


def carried_state_retain_graph() -> WatchTrace:
    # findings corpus gru_cell_no_detach "fixed" with retain_graph=True as the error suggests;
    # the cell is frozen (only the head learns), so no in-place update stops the loop
    findings_corpus.seed()
    cell, head = nn.GRUCell(4, 8), nn.Linear(8, 1)
    cell.requires_grad_(False)
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    xs, ys = torch.randn(STEPS, 2, 4), torch.randn(STEPS, 2, 1)
    with am.watch(first=0) as w:
        state = torch.zeros(2, 8, requires_grad=True)
        for x, y in zip(xs, ys):
            state = cell(x, state)
            loss = F.mse_loss(head(state), y)
            opt.zero_grad()
            loss.backward(retain_graph=True)
            opt.step()
    return w.result


def validation_outputs_with_grad() -> WatchTrace:
    # examples/08_real_models.ipynb: validation outputs collected each step without no_grad
    model, opt, data = mlp_data()
    x_val = torch.randn(8, 6)
    with am.watch(first=0) as w:
        val = []
        for x, y in data:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            val.append(model(x_val))
    return w.result


def late_loss_history() -> WatchTrace:
    # loss_history with the bug behind a condition: the losses are kept from step 11 on
    model, opt, data = mlp_data()
    with am.watch(first=0) as w:
        losses = []
        for step, (x, y) in enumerate(data):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if step >= 10:
                losses.append(loss)
    return w.result


def module_running_stat() -> WatchTrace:
    # findings corpus module_running_stat: running statistics assigned with their graph
    findings_corpus.seed()
    norm, head = findings_corpus.RunningNorm(6), nn.Linear(6, 1)
    opt = torch.optim.SGD([*norm.parameters(), *head.parameters()], lr=0.1)
    with am.watch(first=0) as w:
        for _ in range(STEPS):
            x, y = torch.randn(8, 6), torch.randn(8, 1)
            loss = F.mse_loss(head(norm(x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return w.result


@dataclass(frozen=True)
class Bug:
    loop: Callable[[], WatchTrace]
    start: int  # the first step whose graph is kept
    holder: str  # what a finding of the window names
    gap: str = ""  # why the counters miss it (the test expects the miss)


# The running mean's chain (mul by a number, add, mean) saves no tensor and has no backward
# root: each step adds a few nodes, but neither counter moves.
UNSEEN = (
    "a chain that saves no tensor and is no backward root (0.9 * running + 0.1 * h.mean(0)) "
    "grows by nodes only: live roots and retained saved bytes stay flat; only a live-node count "
    "(the per-op function mode, the cost counted steps avoid) would see it"
)


BUGS = {
    "loss-history": Bug(loss_history, 1, "losses"),
    "total-loss": Bug(total_loss_tensor, 1, "total_loss"),
    "self-loss-dict": Bug(self_loss_in_a_dict, 1, "trainer.history"),
    "logger": Bug(logger_keeps_loss, 1, "logger.history"),
    "carried-state": Bug(carried_state_retain_graph, 1, "state"),
    "validation-outputs": Bug(validation_outputs_with_grad, 1, "val"),
    "late-loss-history": Bug(late_loss_history, 11, "losses"),
    "running-stat": Bug(module_running_stat, 1, "norm.running_mean", gap=UNSEEN),
}


def _bug(name: str) -> Any:
    gap = BUGS[name].gap
    return pytest.param(name, marks=[pytest.mark.xfail(reason=gap, strict=True)] if gap else [])


@pytest.mark.parametrize("name", [_bug(name) for name in sorted(BUGS)])
def test_escalation_captures_a_growth_bug_within_ten_steps_and_names_its_holder(name):
    """GIVEN a 30-step loop whose graphs pile up from step `start` WHEN watched with nothing
    captured up front THEN a window opens within 10 steps of the start, and its findings name
    the holder."""
    bug = BUGS[name]
    result = bug.loop()
    assert result.steps_done == STEPS
    counters = [(s.live_roots, s.retained_bytes) for s in result.steps]
    assert result.windows, f"no window; counters {counters}"
    window = result.windows[0]
    assert 0 <= window.first_step - bug.start <= WITHIN, window.reason
    assert "grew from step" in window.reason
    holders = {f.holder for f in window.trace.findings}
    assert bug.holder in holders, [(f.kind, f.holder, f.line) for f in window.trace.findings]


# ===== correct loops: no window ==============================================================
def _watched_until(steps: int, run: Callable[[], object]) -> WatchTrace:
    """`run()` again and again in one watched block until `steps` steps have ended."""
    with am.watch(first=0) as w:
        while w.result.steps_done < steps:
            before = w.result.steps_done
            run()
            if w.result.steps_done == before:
                pytest.skip("the loop calls no backward: no step to count")
    return w.result


def _no_window(result: WatchTrace) -> None:
    assert result.steps_done >= STEPS
    counters = [(s.live_roots, s.retained_bytes) for s in result.steps]
    assert result.windows == [], (result.windows[0].reason, counters)


COUNTS_ITS_BATCHES = {"batchnorm_dropout_train_step"}  # asserts it ran 3: repeated instead


@pytest.mark.parametrize(
    "loop", test_real_loops.CORRECT, ids=[f.__name__ for f in test_real_loops.CORRECT]
)
def test_a_correct_loop_of_real_loops_never_opens_a_window(loop, monkeypatch):
    """GIVEN a correct loop shape of test_real_loops, its batches 30 long WHEN watched for 30
    steps or more THEN no window is opened."""
    batches = test_real_loops.batches
    if loop.__name__ not in COUNTS_ITS_BATCHES:
        monkeypatch.setattr(test_real_loops, "batches", lambda n=3: batches(n * 10))
    _no_window(_watched_until(STEPS, loop))


class _CountedOnly:
    """`autograd_magic` as the corpus sees it, with `track()` recording nothing: the corpus's
    loops run inside one outer watch."""

    def __getattr__(self, name: str) -> Any:
        return getattr(am, name)

    @staticmethod
    def track(*args: Any, **kwargs: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


CORPUS_CORRECT = [case for case in findings_corpus.CORRECT if not case.known_gap]


@pytest.mark.parametrize("case", CORPUS_CORRECT, ids=lambda case: case.name)
def test_a_correct_loop_of_the_findings_corpus_never_opens_a_window(case, monkeypatch):
    """GIVEN a correct loop of the findings corpus WHEN run again and again in one watched block
    for 30 steps or more THEN no window is opened."""
    monkeypatch.setattr(findings_corpus, "am", _CountedOnly())
    _no_window(_watched_until(STEPS, case.loop))


def test_a_window_records_autograd_grad_calls(monkeypatch):
    """GIVEN WGAN-GP's loop (torch.autograd.grad with create_graph for the gradient penalty)
    WHEN watched with its first steps captured THEN the window records the grad calls (torch
    hands the mode the counted-steps wrapper it finds in torch.autograd, bound as torch's own)."""
    monkeypatch.setattr(findings_corpus, "am", _CountedOnly())
    with am.watch(first=3) as w:
        findings_corpus.wgan_gp()
    window = w.result.windows[0]
    assert window.last_step == 3
    calls = window.trace.backward_calls
    assert [c.kind for c in calls].count("grad") >= 1
    assert any(c.create_graph for c in calls)
