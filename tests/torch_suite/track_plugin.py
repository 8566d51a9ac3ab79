"""pytest plugin for the PyTorch suite runner: each test's call phase (for a unittest case:
setUp, the test, tearDown) runs inside `autograd_magic.track()`, as a user's block would."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

import autograd_magic

_left_behind: list[str] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """Run the test inside a recorder block; the test's own exception passes through it."""
    try:
        with autograd_magic.track():
            return (yield)
    finally:
        # A block that leaves a mode or hook behind would change every later test: remove it
        # and name the test, so one leak does not read as many unrelated failures.
        if autograd_magic.uninstall():
            _left_behind.append(item.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the tests after which a recorder was still installed."""
    for nodeid in _left_behind:
        terminalreporter.write_line(f"TRACK-LEFT-INSTALLED {nodeid}")
