"""Issue 31 item 5: outside IPython too, an error leaving a block carries the untracked traceback:
`traceback.format_exc()`, `logging.exception`, an uncaught error in a script and
`python -m autograd_magic run` print the same frames and line numbers as untracked."""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Callable

import pytest
import torch
from test_cli import python
from test_cli import tracked as run_tracked

import autograd_magic as am


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class _FailsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("no gradient here")


class _FailsInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x @ x

    @staticmethod
    def backward(ctx, grad):
        return grad


def shape_mismatch_in_matmul() -> None:
    torch.ones(2, 3) @ torch.ones(2, 3)


def inplace_error_in_backward() -> None:
    a = torch.ones(3, requires_grad=True)
    b = a.sigmoid()
    b.mul_(2)
    b.sum().backward()


def error_inside_a_module_forward() -> None:
    _Linear()(torch.ones(2, 5))


def error_in_a_custom_function_backward() -> None:
    _FailsInBackward.apply(torch.ones(2, requires_grad=True)).sum().backward()


def error_in_a_custom_function_forward() -> None:
    _FailsInForward.apply(torch.ones(2, 3, requires_grad=True))


def bad_dim_in_a_python_torch_function() -> None:
    torch.nn.functional.softmax(torch.ones(3, requires_grad=True) * 2, dim=4)


ERRORS = [
    shape_mismatch_in_matmul,
    inplace_error_in_backward,
    error_inside_a_module_forward,
    error_in_a_custom_function_backward,
    error_in_a_custom_function_forward,
    bad_dim_in_a_python_torch_function,
]


def _caught(run: Callable[[], None], tracked: bool) -> BaseException:
    block = am.track() if tracked else contextlib.nullcontext()
    try:
        with block:
            run()  # the same line both ways: the first frame is identical too
    except Exception as error:
        return error
    raise AssertionError("did not raise")


@pytest.mark.parametrize("run", ERRORS, ids=lambda f: f.__name__)
def test_a_caught_error_formats_as_untracked(run):
    """GIVEN code that raises in torch (a shape mismatch, an in-place error in backward, a module's
    forward, a custom Function, a torch function written in Python) WHEN the error leaves a block
    THEN traceback.format_exception gives the untracked text: frames, lines and carets."""
    plain = "".join(traceback.format_exception(_caught(run, False)))
    tracked = "".join(traceback.format_exception(_caught(run, True)))
    assert "autograd_magic" not in tracked
    assert tracked == plain


def test_logging_exception_logs_the_untracked_traceback(caplog):
    """GIVEN logging.exception in the handler of an error that left a block WHEN it logs THEN
    the record's traceback is the untracked one."""
    texts = []
    for tracked in (False, True):
        caplog.clear()
        block = am.track() if tracked else contextlib.nullcontext()
        try:
            with block:
                error_inside_a_module_forward()
        except RuntimeError:
            logging.getLogger("train").exception("step failed")
        texts.append(caplog.records[0].exc_text)
    assert texts[0] and texts[1] == texts[0]


_SCRIPT = """\
import torch
import autograd_magic as am
TRACKED = {tracked}

def step(model, x):
    return model(x).sum()

model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
with am.track() if TRACKED else open(__file__):
    step(model, torch.ones(2, 5))
"""


def test_an_uncaught_error_in_a_script_prints_the_untracked_traceback(tmp_path):
    """GIVEN a script whose block raises in a module's forward WHEN nothing catches it THEN
    Python prints the traceback it prints untracked, and so does `python -m autograd_magic run`
    running the untracked script."""
    (tmp_path / "train.py").write_text(_SCRIPT.format(tracked=False))
    (tmp_path / "tracked.py").write_text(_SCRIPT.format(tracked=True))
    plain = python("train.py", cwd=tmp_path)
    inside = python("tracked.py", cwd=tmp_path)
    run = run_tracked("run", "-o", "t.json", "train.py", cwd=tmp_path)
    assert plain.returncode == inside.returncode == run.returncode == 1
    assert "Traceback" in plain.stderr and "autograd_magic" not in plain.stderr
    assert inside.stderr.replace("tracked.py", "train.py") == plain.stderr
    assert run.stderr.startswith(plain.stderr), run.stderr


def _caught_inside(run: Callable[[], None], tracked: bool) -> list[str]:
    """Where the traceback of an error caught inside the block points (file name, function)."""
    with am.track() if tracked else contextlib.nullcontext():
        try:
            run()
        except Exception as error:
            entries = traceback.extract_tb(error.__traceback__)
    return [f"{entry.filename.rsplit('/', 1)[-1]}:{entry.name}" for entry in entries]


@pytest.mark.parametrize("run", ERRORS, ids=lambda f: f.__name__)
def test_an_error_caught_inside_the_block_shows_at_most_three_more_frames(run):
    """GIVEN an error caught inside the block (README Limits) WHEN its traceback is read there
    THEN it has the untracked frames plus at most three: the mode's frame, and for a torch
    function written in Python torch's dispatch to it (or a module call's longer branch)."""
    plain = _caught_inside(run, False)
    tracked = _caught_inside(run, True)
    extra = list(tracked)
    for entry in plain:
        extra.remove(entry)
    assert len(extra) <= 3
    assert "mode.py:__torch_function__" in extra
    assert set(extra) <= {
        "mode.py:__torch_function__",
        "overrides.py:handle_torch_function",
        "module.py:inner",
        "_tensor.py:backward",
        "functional.py:softmax",
    }
