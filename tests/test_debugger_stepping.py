"""A debugger stepping through tracked code stops where it stops untracked.

The recorder is Python code that torch calls from inside the user's ops, module calls and
backward; `pdb` (and IPython's debugger, a `pdb.Pdb`) would stop in each of its frames. They
step over it as over a builtin. What remains: a torch function written in Python (`F.relu`,
`Tensor.register_hook`, `Tensor.backward`) is entered twice, once by the user and once by
PyTorch's dispatch to a function mode, so stepping into one shows its first line and its return
one more time each.
"""

from __future__ import annotations

import importlib.util
import io
import pdb
import sys
from pathlib import Path
from types import ModuleType

import torch

import autograd_magic as am

USER_CODE = """\
import torch
import torch.nn.functional as F


def hook(grad):
    doubled = grad * 2
    return doubled


def step(x):
    y = x.exp()
    y.register_hook(hook)
    z = F.relu(y) * 2
    loss = z.sum()
    loss.backward()
    return loss
"""
PYTHON_TORCH_FUNCTIONS_STEPPED_INTO = 3  # register_hook, F.relu, Tensor.backward


def _user_module(tmp_path: Path) -> ModuleType:
    path = tmp_path / "user_step.py"
    path.write_text(USER_CODE)
    spec = importlib.util.spec_from_file_location("user_step", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stops(module: ModuleType, tracked: bool) -> list[str]:
    """Every place pdb stops at while the user presses `s` until the function ends. (IPython's
    debugger is a pdb.Pdb and asks the same `stop_here`.)"""
    commands, out = io.StringIO("s\n" * 2000 + "c\n"), io.StringIO()
    debugger = pdb.Pdb(stdin=commands, stdout=out)
    debugger.use_rawinput = False
    x = torch.ones(3, requires_grad=True)
    trace = sys.gettrace()
    try:
        if tracked:
            with am.track():
                debugger.runcall(module.step, x)
        else:
            debugger.runcall(module.step, x)
    finally:
        sys.settrace(trace)
    return [line for line in out.getvalue().splitlines() if line.startswith("> ")]


def test_stepping_stops_on_the_same_lines_and_never_in_the_recorder(tmp_path):
    """GIVEN a function with torch ops, a Python torch function, a hook and backward WHEN the user
    steps through it with `s` in a block THEN the debugger stops on the same lines of the user's
    file, never in autograd_magic or torch's dispatch to modes, and at most twice more per
    Python torch function stepped into."""
    module = _user_module(tmp_path)
    untracked = _stops(module, tracked=False)
    tracked = _stops(module, tracked=True)
    user_file = str(tmp_path / "user_step.py")
    assert [s for s in tracked if user_file in s] == [s for s in untracked if user_file in s]
    assert len([s for s in untracked if user_file in s]) >= 4  # it did step through the body
    assert not [s for s in tracked if "autograd_magic" in s]
    dispatch = ("handle_torch_function", "_pop_mode_temporarily", "contextlib")
    assert not [s for s in tracked if any(name in s for name in dispatch)]
    assert 0 <= len(tracked) - len(untracked) <= 2 * PYTHON_TORCH_FUNCTIONS_STEPPED_INTO
