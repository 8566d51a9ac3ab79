"""Shared fixtures: every test must leave no recorder mode, hook or patch installed."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.overrides import _get_current_function_mode_stack


def _installed() -> tuple:
    return (
        len(_get_current_function_mode_stack()),
        torch._C._autograd._top_saved_tensors_default_hooks(False),
        torch.from_numpy,
        torch.autograd.graph.saved_tensors_hooks.__enter__,
    )


@pytest.fixture(autouse=True)
def no_instrumentation_left_behind():
    """GIVEN any test WHEN it ends THEN no function mode, saved-tensor hook or patch remains."""
    before = _installed()
    yield
    assert _installed() == before, "autograd_magic left instrumentation installed"


@pytest.fixture
def gc_disabled():
    """Freeing moments are compared with the cycle collector off, as users see them."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was_enabled:
        gc.enable()
