"""Library code decides the same with a block open: fast paths, default devices, lazy modules.

PyTorch code asks the function-mode stack questions (`torch.overrides.has_torch_function`, "is a
`DeviceContext` at the bottom?") and picks an algorithm or raises from the answer. The recorder's
mode must not change any answer: same bits, same warnings, same state afterwards.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from instrumentation import no_saved_hooks
from torch import nn
from torch.overrides import _get_current_function_mode_stack

import autograd_magic as am


def _block(tracked: bool) -> contextlib.AbstractContextManager:
    return am.track() if tracked else contextlib.nullcontext()


def _outcome(body: Callable[[bool], Any], tracked: bool) -> tuple[Any, list[str]]:
    """(what `body` returned or raised, the warnings it raised), seeded the same each run."""
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = body(tracked)
        except Exception as error:
            result = (type(error).__name__, str(error))
    return result, [f"{w.category.__name__}: {w.message}" for w in caught]


def _bits(t: torch.Tensor) -> tuple:
    t = t.to_padded_tensor(0.0) if t.is_nested else t
    return (t.dtype, tuple(t.shape), t.reshape(-1).contiguous().view(torch.uint8).tolist())


# ----- fast paths: torch.overrides.has_torch_function -----------------------------------------
def _encoder_inference(tracked: bool) -> Any:
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(3, 5, 16)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[:, 3:] = True
    with _block(tracked), torch.no_grad():
        return _bits(encoder(x, src_key_padding_mask=padding))


def _attention_inference(tracked: bool) -> Any:
    attention = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 6, 16)
    with _block(tracked), torch.inference_mode():
        out, weights = attention(x, x, x, need_weights=False)
        return _bits(out), weights


def _transformer_inference(tracked: bool) -> Any:
    model = nn.Transformer(16, 2, 1, 1, 32, batch_first=True).eval()
    src, tgt = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    with _block(tracked), torch.no_grad():
        return _bits(model(src, tgt))


def _subclass_still_takes_the_slow_path(tracked: bool) -> Any:
    """A tensor subclass is a real reason to skip the fast path: the answer stays True."""

    class Logged(torch.Tensor):
        calls: list[str] = []

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            cls.calls.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    attention = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(1, 3, 8).as_subclass(Logged)
    with _block(tracked), torch.no_grad():
        out, _ = attention(x, x, x)
    return _bits(out.as_subclass(torch.Tensor)), sorted(set(Logged.calls))


FAST_PATHS = {
    "TransformerEncoder with padding, no_grad": _encoder_inference,
    "MultiheadAttention, inference_mode": _attention_inference,
    "Transformer, no_grad": _transformer_inference,
    "MultiheadAttention on a subclass": _subclass_still_takes_the_slow_path,
}


def _outcome_in_fresh_process(table: str, case: str, tracked: bool) -> str:
    """`_outcome` of `table[case]`, as text, from a new Python process: PyTorch's C++ code warns
    once per process, so each side needs its own."""
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import test_library_decisions as t\n"
        f"print(repr(t._outcome(t.{table}[{case!r}], tracked={tracked})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    return done.stdout


@pytest.mark.parametrize("case", list(FAST_PATHS))
def test_standard_modules_take_the_same_fast_path_tracked(case):
    """GIVEN a standard module in eval under no_grad/inference_mode WHEN it runs in a block THEN it
    computes the same bits and raises the same warnings as untracked (its fast path is taken)."""
    untracked = _outcome_in_fresh_process("FAST_PATHS", case, tracked=False)
    tracked = _outcome_in_fresh_process("FAST_PATHS", case, tracked=True)
    assert tracked == untracked


def test_has_torch_function_answers_as_untracked():
    plain, param = torch.ones(2), nn.Parameter(torch.ones(2))
    with am.track():
        assert not torch.overrides.has_torch_function((plain, param))
    assert torch.overrides.has_torch_function is torch._C._has_torch_function


# ----- torch.set_default_device keeps its DeviceContext at the bottom ---------------------------
@contextlib.contextmanager
def _default_device_restored() -> Iterator[None]:
    try:
        yield
    finally:
        torch.set_default_device(None)


def _set_before_and_inside(tracked: bool) -> Any:
    torch.set_default_device("meta")
    with _block(tracked):
        torch.set_default_device("cpu")
        inside = torch.ones(1).device
    return str(inside), str(torch.ones(1).device), _mode_names()


def _set_inside_then_after(tracked: bool) -> Any:
    with _block(tracked):
        torch.set_default_device("meta")
        inside = torch.ones(1).device
    torch.set_default_device("cpu")
    return str(inside), str(torch.ones(1).device), _mode_names()


def _set_inside_kept_after(tracked: bool) -> Any:
    with _block(tracked):
        torch.set_default_device("meta")
    return str(torch.ones(1).device), str(torch.get_default_device()), _mode_names()


def _mode_names() -> list[str]:
    return [type(mode).__name__ for mode in _get_current_function_mode_stack()]


DEFAULT_DEVICE = {
    "set before the block and inside": _set_before_and_inside,
    "set inside, then after": _set_inside_then_after,
    "set inside, kept after": _set_inside_kept_after,
}


@pytest.mark.parametrize("case", list(DEFAULT_DEVICE))
def test_set_default_device_in_a_block_works_and_lasts(case):
    """GIVEN torch.set_default_device called in a block WHEN the block runs and ends THEN nothing
    raises and the user's default device is the one untracked code has."""
    with _default_device_restored():
        untracked = _outcome(DEFAULT_DEVICE[case], tracked=False)
    with _default_device_restored():
        tracked = _outcome(DEFAULT_DEVICE[case], tracked=True)
    assert tracked == untracked
    assert "Error" not in str(tracked[0])


# ----- lazy modules ------------------------------------------------------------------------------
def _lazy_modules(tracked: bool) -> Any:
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2))
    conv = nn.LazyConv2d(3, 3)
    with _block(tracked):
        out = model(torch.randn(5, 7)).sum() + conv(torch.randn(1, 2, 6, 6)).sum()
        out.backward()
        lazy_data = nn.LazyLinear(3).weight.data
    grads = [_bits(p.grad) for p in [*model.parameters(), *conv.parameters()]]
    return _bits(out.detach()), grads, type(lazy_data).__name__


def test_lazy_modules_initialize_and_train_in_a_block():
    untracked = _outcome(_lazy_modules, tracked=False)
    tracked = _outcome(_lazy_modules, tracked=True)
    assert tracked == untracked


# ----- other code's saved-tensor hooks are never run by the recorder ------------------------------
def _checkpoint_forward_runs(tracked: bool) -> Any:
    from torch.utils.checkpoint import checkpoint

    runs: list[str] = []

    def body(x: torch.Tensor) -> torch.Tensor:
        runs.append("forward")
        return x.exp().sin()

    a = torch.randn(3, requires_grad=True)
    with _block(tracked):
        y = checkpoint(body, a, use_reentrant=False)
        after_forward = len(runs)
        y.sum().backward()
        debug = checkpoint(body, a, use_reentrant=False, debug=True)
        debug.sum().backward()
    return after_forward, len(runs), _bits(a.grad)


class _ClearedOnAccess(torch.autograd.Function):
    clear_saved_tensors_on_access = True

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * x


def _cleared_on_access(tracked: bool) -> Any:
    a = torch.randn(2, requires_grad=True)
    with _block(tracked):
        _ClearedOnAccess.apply(a.exp()).sum().backward()
    return _bits(a.grad)


SAVED_HOOKS = {
    "checkpoint without reentrant, debug too": _checkpoint_forward_runs,
    "Function with clear_saved_tensors_on_access": _cleared_on_access,
}


@pytest.mark.parametrize("case", list(SAVED_HOOKS))
def test_saved_tensors_of_other_hooks_are_not_unpacked_by_the_recorder(case):
    """GIVEN saved tensors packed by the user's hooks (checkpoint recomputes on unpack) or read at
    most once WHEN the recorder assigns them to nodes THEN it never unpacks them: the forward runs
    as often as untracked and backward raises nothing."""
    assert _outcome(SAVED_HOOKS[case], tracked=True) == _outcome(SAVED_HOOKS[case], tracked=False)


def _detached_in_place(tracked: bool) -> Any:
    a = torch.tensor(1.0, requires_grad=True).clone()
    with _block(tracked):
        b = a.sin()
        a.detach_()
        b.backward()
    return "ran"


def test_a_saved_input_detached_in_place_is_refused_as_untracked():
    """GIVEN a saved non-leaf input detached in place WHEN backward unpacks it in a block THEN
    PyTorch's own error is raised (its check is skipped while saved-tensor hooks are set)."""
    untracked = _outcome(_detached_in_place, tracked=False)
    assert "detached in-place" in str(untracked[0])
    assert _outcome(_detached_in_place, tracked=True) == untracked


def _disable_refused_inside_user_hooks(tracked: bool) -> Any:
    graph = torch.autograd.graph
    seen = []
    with _block(tracked):
        with graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            try:
                with graph.disable_saved_tensors_hooks("refused"):
                    pass
            except RuntimeError as error:
                seen.append(str(error))
        # The user's hooks are gone with their context: disabling works now.
        with graph.disable_saved_tensors_hooks("outer"), graph.disable_saved_tensors_hooks("in"):
            try:
                with graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                    pass
            except RuntimeError as error:
                seen.append(str(error))
    return seen, no_saved_hooks()


def test_a_refused_disable_inside_user_hooks_leaves_the_hook_stack_as_untracked():
    """GIVEN disable_saved_tensors_hooks refused inside the user's own saved-tensor hooks WHEN it
    raises in a block THEN the user's hooks leave with their context, as untracked (the recorder
    put its hooks back above theirs, and their exit popped the recorder's instead)."""
    untracked = _outcome(_disable_refused_inside_user_hooks, tracked=False)
    assert untracked[0] == (["refused", "in"], True)
    assert _outcome(_disable_refused_inside_user_hooks, tracked=True) == untracked
