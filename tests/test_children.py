"""Issue 31 item 7: what a block leaves in processes and libraries beyond it. A child forked
during a block (DataLoader workers, multiprocessing) runs untracked; a library that binds
`warnings.warn` while a block runs keeps the real one."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import warnings

import pytest
import torch
from instrumentation import installed

import autograd_magic as am

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")


def _child_is_clean(baseline: tuple) -> bool:
    """In the child: whether nothing of the recorder is installed around a training step."""
    x = torch.ones(3, requires_grad=True)
    (x.exp() * 2).sum().backward()
    return installed() == baseline


def _report(queue: multiprocessing.Queue, baseline: tuple) -> None:
    queue.put(_child_is_clean(baseline))


def test_a_process_forked_during_a_block_runs_untracked():
    """GIVEN a block WHEN a child is forked inside it (os.fork, multiprocessing's fork) and
    runs a training step THEN nothing of the recorder is installed in the child."""
    baseline = installed()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    with am.track():
        x = torch.ones(3, requires_grad=True)
        y = x.exp()
        process = context.Process(target=_report, args=(queue, baseline))
        process.start()
        process.join(60)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(read)
            clean = _child_is_clean(baseline)
            os.write(write, b"1" if clean else b"0")
            os._exit(0)
        os.close(write)
        forked_clean = os.read(read, 1) == b"1"
        os.close(read)
        os.waitpid(pid, 0)
        del y
    assert queue.get(timeout=10) is True
    assert forked_clean
    assert process.exitcode == 0


_LIBRARY = """\
from warnings import warn


def deprecated():
    warn("old API", DeprecationWarning, stacklevel=2)
"""


def test_a_library_imported_during_a_block_keeps_the_real_warn(tmp_path, monkeypatch):
    """GIVEN a library doing `from warnings import warn` WHEN it is first imported inside a
    block THEN after the block its `warn` is the real `warnings.warn`, and warns at its
    caller's line as untracked."""
    (tmp_path / "oldlib.py").write_text(_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    with am.track():
        oldlib = importlib.import_module("oldlib")
    try:
        assert oldlib.warn is warnings.warn
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            oldlib.deprecated()
        assert caught[0].filename == __file__
    finally:
        sys.modules.pop("oldlib", None)


@pytest.mark.parametrize("stacklevel", [0, -1, 1])
def test_a_warning_with_stacklevel_zero_names_the_line_untracked_names(stacklevel):
    """GIVEN warnings.warn(..., stacklevel=0) (or below) in a block WHEN it warns THEN the
    warning names the calling line, as untracked (was: autograd_magic's warnings_site.py)."""
    sites = []
    for tracked in (False, True):
        with (
            am.track() if tracked else warnings.catch_warnings(),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            warnings.warn("careful", UserWarning, stacklevel=stacklevel)
        sites.append((caught[0].filename, caught[0].lineno))
    assert sites[0][0] == __file__
    assert sites[1] == sites[0]
