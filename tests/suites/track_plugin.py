"""pytest plugin for other projects' test suites: each phase of each test (setup, call, teardown)
runs inside its own `autograd_magic.track()` block, as a user's block would. A unittest case's
setUp, body and tearDown run in the call phase. Load it with `-p track_plugin` and this folder on
PYTHONPATH (run_suite.py does both); not a test module, so pytest never collects it."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

import autograd_magic


def _tracked(item: pytest.Item, phase: str) -> Generator[None, Any, Any]:
    """Run one phase inside a recorder block; the test's own exception passes through it."""
    try:
        with autograd_magic.track():
            return (yield)
    finally:
        # A block that leaves a mode or hook behind would change every later test: remove it
        # and name the test, so one leak does not read as many unrelated failures.
        # The name travels as a user property: it reaches the JUnit XML from pytest-xdist's
        # workers too, where no terminal summary is written.
        if autograd_magic.uninstall():
            item.user_properties.append(("track_left_installed", phase))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    """The fixtures' setup, tracked."""
    return (yield from _tracked(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """The test itself, tracked."""
    return (yield from _tracked(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    """The fixtures' teardown, tracked."""
    return (yield from _tracked(item, "teardown"))
