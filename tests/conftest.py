"""Shared fixtures: every test must leave no recorder mode, hook or patch installed."""

from __future__ import annotations

import gc

import pytest
from instrumentation import installed


@pytest.fixture(autouse=True)
def no_instrumentation_left_behind():
    """GIVEN any test WHEN it ends THEN no function mode, saved-tensor hook or patch remains."""
    before = installed()
    yield
    assert installed() == before, "autograd_magic left instrumentation installed"


@pytest.fixture
def gc_disabled():
    """Freeing moments are compared with the cycle collector off, as users see them."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was_enabled:
        gc.enable()
