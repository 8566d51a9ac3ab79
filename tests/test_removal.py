"""Issue 31 item 2: a block always ends. Removing the recorder is bounded: a removal that fails
every time is reported once, and the user's exception or KeyboardInterrupt leaves the block."""

from __future__ import annotations

import warnings

import pytest
import torch

import autograd_magic as am
from autograd_magic.recorder import stacks

# The unfixed exit retried forever: after this many calls the fake lets removal succeed, so a
# regression fails the test instead of hanging the suite.
_SAFETY_VALVE = 10_000


@pytest.fixture
def failing_removal(monkeypatch):
    """`stacks.remove_mode` raising `make()` on every call (up to the safety valve); yields the
    list of calls made. What stays installed is removed afterwards."""
    calls: list[int] = []
    original = stacks.remove_mode
    state: dict = {}

    def remove_mode(mode):
        calls.append(1)
        if len(calls) < _SAFETY_VALVE:
            raise state["make"]()
        original(mode)

    monkeypatch.setattr(stacks, "remove_mode", remove_mode)
    yield state, calls
    monkeypatch.undo()
    am.uninstall()


def test_a_removal_that_always_fails_ends_the_block_and_is_reported_once(failing_removal):
    """GIVEN a removal step that raises RuntimeError every time WHEN a block ends THEN it ends
    after a few tries, the user's result stands, one warning and one blindspot say so, and what
    stays installed only passes calls on."""
    state, calls = failing_removal
    state["make"] = lambda: RuntimeError("private function missing")
    with pytest.warns(RuntimeWarning, match="could not remove") as caught, am.track() as trace:
        y = torch.ones(3, requires_grad=True) * 2
    assert len(calls) <= 5
    assert len([w for w in caught if "could not remove" in str(w.message)]) == 1
    assert [b for b in trace.blindspots if "could not remove" in b.message]
    nodes = len(trace.nodes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y * 3).sum().backward()  # through the mode left behind: recorded nowhere
    assert len(trace.nodes) == nodes


def test_the_users_exception_leaves_a_block_whose_removal_fails(failing_removal):
    """GIVEN a failing removal WHEN the block raises ValueError THEN the ValueError propagates."""
    state, calls = failing_removal
    state["make"] = lambda: RuntimeError("private function missing")
    with pytest.warns(RuntimeWarning), pytest.raises(ValueError, match="mine"), am.track():
        raise ValueError("mine")
    assert len(calls) <= 5


def test_a_keyboard_interrupt_during_a_failing_removal_propagates(failing_removal):
    """GIVEN a removal interrupted every time (Stop pressed during it) WHEN the block ends THEN
    the KeyboardInterrupt leaves the block after a bounded number of tries."""
    state, calls = failing_removal
    state["make"] = KeyboardInterrupt
    with pytest.warns(RuntimeWarning), pytest.raises(KeyboardInterrupt), am.track():
        torch.ones(2) * 2
    assert len(calls) <= 20
