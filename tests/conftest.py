"""Shared fixtures: every test must leave no recorder mode, hook or patch installed."""

from __future__ import annotations

import gc

import pytest
import torch
from instrumentation import installed


@pytest.fixture(autouse=True)
def no_instrumentation_left_behind():
    """GIVEN any test WHEN it ends THEN no function mode, saved-tensor hook or patch remains."""
    before = installed()
    yield
    assert installed() == before, "autograd_magic left instrumentation installed"


@pytest.fixture
def shell():
    """A fresh-enough IPython shell with the extension loaded, torch imported, no colours; the
    names cells commonly bind are dropped afterwards."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("colors", "nocolor")
    ip.extension_manager.load_extension("autograd_magic")
    ip.user_ns["torch"] = torch
    yield ip
    for name in ("ran", "tr", "a", "b", "c", "d", "e", "x", "y", "cell_end"):
        ip.user_ns.pop(name, None)


@pytest.fixture
def gc_disabled():
    """Freeing moments are compared with the cycle collector off, as users see them."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was_enabled:
        gc.enable()
