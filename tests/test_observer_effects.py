"""Issue 10: watching must not change code nobody here wrote (namespaces, generators, signals,
torch.func, user modes and subclasses, exceptions). Each test compares against untracked runs."""

from __future__ import annotations

import contextlib
import cProfile
import gc
import pstats
import subprocess
import sys
import threading
import traceback
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy
import pytest
import torch
from instrumentation import installed, no_saved_hooks
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import TorchDispatchMode

import autograd_magic as am


# ----- 1. the user's namespace is never written --------------------------------------------------
def _hyperparameters(tracked: bool, lr: float = 0.1) -> dict:
    hp = locals()
    x = torch.ones(2, requires_grad=True)
    if tracked:
        with am.track():
            (x * 2).sum().backward()
    else:
        (x * 2).sum().backward()
    return {k: v for k, v in hp.items() if k != "tracked"}


def test_locals_snapshot_taken_before_the_block_is_left_as_it_was():
    assert _hyperparameters(True) == _hyperparameters(False)


def _freed_after_del(tracked: bool, snapshot_first: bool) -> list[str]:
    log: list[str] = []
    x = torch.randn(3, requires_grad=True)
    if snapshot_first:
        locals()
    weakref.finalize(x, log.append, "x died")
    if tracked:
        with am.track():
            y = x.exp()
    else:
        y = x.exp()
    del y
    log.append("y dropped")
    del x
    log.append("x dropped")
    return log


def test_reading_names_does_not_extend_a_local_tensor_life(gc_disabled):
    for snapshot_first in (False, True):
        assert _freed_after_del(True, snapshot_first) == _freed_after_del(False, snapshot_first)


def test_locals_of_a_function_still_name_what_they_hold():
    def run() -> am.Trace:
        weights = torch.ones(3, requires_grad=True)
        with am.track() as trace:
            kept = weights.exp()
        del kept
        return trace

    trace = run()
    assert [h.path for h in trace.holders] == ["kept"]


# ----- 2. exits in any order restore exactly what each block installed ---------------------------
def _block(steps: list[str], name: str) -> Iterator[None]:
    with am.track():
        x = torch.ones(2, requires_grad=True)
        yield
        steps.append(f"{name}: {len(_get_current_function_mode_stack())} modes")
        (x * 2).sum().backward()
        yield


def test_blocks_held_by_generators_may_end_in_any_order():
    before = installed()
    steps: list[str] = []
    first, second = _block(steps, "first"), _block(steps, "second")
    next(first)
    next(second)
    next(first)
    next(second)
    for gen in (first, second):
        with contextlib.suppress(StopIteration):
            next(gen)
    assert installed() == before
    assert steps == ["first: 2 modes", "second: 2 modes"]


def test_a_block_ending_inside_another_keeps_the_other_installed():
    before = installed()
    outer, inner = _block([], "outer"), _block([], "inner")
    next(outer)
    next(inner)
    with contextlib.suppress(StopIteration):
        next(outer)
        next(outer)
    # The outer block is over: only the inner block's mode and hooks remain, and they still work.
    assert len(_get_current_function_mode_stack()) == 1
    with contextlib.suppress(StopIteration):
        next(inner)
        next(inner)
    assert installed() == before


def _tracked_steps() -> Iterator[None]:
    with am.track():
        yield
        yield


def test_a_block_that_ends_on_another_thread_leaves_nothing_behind_on_the_first():
    before = installed()
    steps = _tracked_steps()
    next(steps)  # the block begins on this thread ...
    worker = threading.Thread(target=lambda: (next(steps, None), next(steps, None)))
    worker.start()
    worker.join()  # ... and ends on another, which cannot reach this thread's stacks
    x = torch.ones(3, requires_grad=True)
    # This thread's first torch call takes the stranded hooks off: PyTorch's own behaviour
    # without hooks (the saved input is the same object; torch.func accepts the code).
    assert x.sin().grad_fn._saved_self is x
    assert torch.equal(torch.func.grad(lambda t: t.sin().sum())(x), x.cos())
    assert am.uninstall() == 1  # the stranded mode, which only passed calls on
    assert installed() == before


def test_uninstall_leaves_a_block_running_on_another_thread_alone():
    entered, release = threading.Event(), threading.Event()
    traces: list[am.Trace] = []

    def worker() -> None:
        with am.track() as trace:
            entered.set()
            release.wait(10)
            torch.ones(2, requires_grad=True).exp()
        traces.append(trace)

    thread = threading.Thread(target=worker)
    thread.start()
    entered.wait(10)
    try:
        assert am.uninstall() == 0  # nothing of this thread's
    finally:
        release.set()
        thread.join()
    assert traces[0].nodes_created == 2  # the other block kept recording: exp, AccumulateGrad


def test_a_recorder_left_by_a_dead_block_is_released():
    gen = _block([], "dropped")
    next(gen)
    recorder_ref = weakref.ref(_get_current_function_mode_stack()[-1].recorder)
    gen.close()
    gc.collect()
    assert recorder_ref() is None


_INTERRUPTS = """
import random, signal, sys
import torch
sys.path.insert(0, "tests")
from instrumentation import installed, no_saved_hooks
import autograd_magic as am

armed = [False]

def interrupt(signum, frame):
    if armed[0]:
        raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
random.seed(0)
x = torch.ones(2, requires_grad=True)
baseline, left, interrupted = installed(), 0, 0
for run in range(RUNS):
    try:
        armed[0] = True
        signal.setitimer(signal.ITIMER_REAL, random.uniform(1e-5, 1e-3))
        try:
            with am.track():
                (x * 2).sum().backward()
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except KeyboardInterrupt:
        interrupted += 1
    if installed() != baseline:
        # torch itself may put a mode back late (an interrupted _pop_mode_temporarily): it must
        # hold no recorder, and the next block takes it out.
        with am.track():
            pass
    if installed() != baseline:
        left += 1
        import autograd_magic.recorder.install as install
        while torch.overrides._get_current_function_mode_stack():
            torch.overrides._pop_mode()
        from instrumentation import no_saved_hooks
        while not no_saved_hooks():
            torch._C._autograd._pop_saved_tensors_default_hooks()
        install._active.clear()
        install.remove_patches(None)
        from torch.nn.modules import module as nn_module
        import autograd_magic.recorder.module_calls as modules
        nn_module._global_forward_pre_hooks.clear()
        nn_module._global_forward_hooks.clear()
        modules._OUR_HOOKS.clear()
        modules._trackers.clear()
        from autograd_magic.recorder import torch_api
        torch_api.set_has_any_global_hook(None)
signal.signal(signal.SIGALRM, signal.SIG_IGN)
print(interrupted, left, flush=True)
"""


def test_keyboard_interrupt_at_any_moment_leaves_nothing_installed():
    script = _INTERRUPTS.replace("RUNS", "3000")
    # The child may end with SIGINT's status: CPython does so after a KeyboardInterrupt it had to
    # ignore (raised inside a finalizer), which the signal can hit too.
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    interrupted, left = map(int, done.stdout.split())
    assert interrupted > 300  # the signal really lands inside the block
    # What remains is CPython checking for signals on entering `__exit__`, before any of our code
    # runs (2 to 9 of 3,000 here; 23 to 28 before removal became idempotent). Python 3.10 checks
    # at more of the `with` statement's exit instructions (no RESUME-based checks yet): 21 of
    # 3,000 in the version matrix's 3.10 + torch 2.4.1 cell. `uninstall()` takes any of them out.
    assert left <= (15 if sys.version_info >= (3, 11) else 30)


# ----- 3. code that runs untracked runs tracked -------------------------------------------------
def _outcome(fn: Callable[[], Any], tracked: bool) -> tuple[Any, Any]:
    """(result or exception type and text, the trace's blindspot kinds)."""
    torch.manual_seed(0)
    trace = None
    try:
        if tracked:
            with am.track() as trace:
                result = fn()
        else:
            result = fn()
    except Exception as error:
        result = (type(error), str(error))
    kinds = None if trace is None else sorted({b.kind for b in trace.blindspots})
    return result, kinds


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool((a == b).all())
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _func_transforms() -> list:
    from torch.func import grad, hessian, jacrev, vjp, vmap

    x = torch.arange(3.0)
    f = lambda t: (t.sin() * t).sum()  # noqa: E731
    return [
        grad(f)(x),
        vjp(torch.sin, x)[1](torch.ones(3))[0],
        jacrev(torch.sin)(x),
        hessian(f)(x),
        vmap(grad(f))(torch.stack([x, x + 1])),
    ]


def _hooks_disabled() -> torch.Tensor:
    x = torch.ones(3, requires_grad=True)
    with torch.autograd.graph.disable_saved_tensors_hooks("no hooks here"):
        y = x.exp().sum()
    y.backward()
    return x.grad


def _nested() -> torch.Tensor:
    a, b = torch.randn(2, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    nt = torch.nested.as_nested_tensor([a, b])
    return nt.sin().to_padded_tensor(0.0)


def _jit_trace() -> torch.Tensor:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    x = torch.randn(2, 3)
    traced = torch.jit.trace(model, x)
    assert "autograd_magic" not in str(traced.graph)
    return traced(x)


def _swap() -> torch.Tensor:
    x, y = torch.ones(3), torch.zeros(3)
    z = x.detach() * 2  # the recorder links x and its detached alias
    torch.utils.swap_tensors(x, y)
    return torch.stack([x, y, z])


def _module_to_with_swap() -> list:
    was = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model = torch.nn.Linear(3, 2)
        model(torch.ones(1, 3)).sum().backward()
        model.to(torch.float64)
        return [p.dtype for p in model.parameters()]
    finally:
        torch.__future__.set_swap_module_params_on_conversion(was)


CRASH_CASES = {
    "Module.to with swap": _module_to_with_swap,
    "torch.func": _func_transforms,
    "disabled hooks": _hooks_disabled,
    "nested": _nested,
    "jit.trace": _jit_trace,
    "swap_tensors": _swap,
}
BLIND = {
    "torch.func": ["torch.func"],
    "disabled hooks": ["hooks-disabled"],
    "jit.trace": ["jit.trace"],
}


@pytest.mark.parametrize("case", list(CRASH_CASES))
def test_code_that_runs_untracked_runs_the_same_tracked(case, gc_disabled):
    untracked, _ = _outcome(CRASH_CASES[case], tracked=False)
    tracked, kinds = _outcome(CRASH_CASES[case], tracked=True)
    assert _same(tracked, untracked), (tracked, untracked)
    assert kinds == BLIND.get(case, [])


def test_an_embedding_with_a_padding_index_is_built_inside_a_block():
    # Its constructor writes in place to a view made under no_grad; reading that view's grad_fn
    # raises, so the recorder must not (Hugging Face models build such embeddings).
    torch.manual_seed(0)
    untracked = torch.nn.Embedding(10, 4, padding_idx=0).weight.detach()
    torch.manual_seed(0)
    with am.track():
        tracked = torch.nn.Embedding(10, 4, padding_idx=0).weight.detach()
    assert torch.equal(tracked, untracked) and tracked[0].abs().sum() == 0


def test_a_view_written_under_no_grad_left_in_the_namespace_does_not_stop_the_naming():
    w = torch.zeros(3, requires_grad=True)
    with am.track() as trace:
        with torch.no_grad():
            row = w[:2]
            row.fill_(1.0)  # now reading row.grad_fn raises
        kept = (w * 2).sum()  # a live graph: the name walk reads every tensor's grad_fn
    assert not [b for b in trace.blindspots if b.kind == "internal"], trace.blindspots
    assert [h.path for h in trace.holders] == ["kept"]
    del row, kept


def test_swap_tensors_works_after_a_block_with_gc_disabled(gc_disabled):
    x, y = torch.ones(3), torch.zeros(3)
    with am.track():
        _ = x * 2
    torch.utils.swap_tensors(x, y)
    assert x.sum() == 0


def _swaps_after_a_block(tracked: bool) -> dict[str, str]:
    """Which tensors a block made, linked, wrote or ran through a module can be swapped once
    it has ended: name -> 'swapped' or the error."""
    model = torch.nn.Linear(3, 2)
    outside = torch.ones(3)
    with am.track() if tracked else contextlib.nullcontext():
        made = torch.ones(3)
        array = numpy.ones(3, dtype=numpy.float32)
        from_numpy = torch.from_numpy(array)
        detached = made.detach()
        viewed = torch.ones(3).view(3)  # a view's base cannot be swapped, tracked or not
        written = torch.ones(3)
        written.add_(1)
        model(torch.ones(1, 3)).sum().backward()
        outside_detached = outside.detach()
        weight_data = model.weight.data
    tensors = {
        "made": made,
        "from_numpy": from_numpy,
        "detached": detached,
        "viewed": viewed,
        "written": written,
        "outside": outside,
        "outside_detached": outside_detached,
        "weight": model.weight,
        "weight_data": weight_data,
    }
    outcomes = {}
    for name, tensor in tensors.items():
        try:
            other = tensor.detach().clone().requires_grad_(tensor.requires_grad)
            torch.utils.swap_tensors(tensor, other)
            outcomes[name] = "swapped"
        except RuntimeError as error:
            outcomes[name] = str(error)
    return outcomes


def test_every_tensor_a_block_saw_can_be_swapped_after_it(gc_disabled):
    """GIVEN tensors a block made, linked (from_numpy, detach, view, .data), wrote in place, or
    ran through a module WHEN the block has ended THEN torch.utils.swap_tensors treats each as
    untracked (it refuses any tensor that still has a weak reference)."""
    untracked = _swaps_after_a_block(False)
    assert set(untracked.values()) == {"swapped"}
    assert _swaps_after_a_block(True) == untracked


def test_a_block_leaves_no_cyclic_garbage(gc_disabled):
    x = torch.ones(3, requires_grad=True)
    with am.track():
        (x * 2).sum().backward()
    assert gc.collect() == 0


def test_track_inside_inference_mode():
    with torch.inference_mode():
        untracked = torch.ones(2) * 2
        with am.track() as trace:
            tracked = torch.ones(2) * 2
    assert torch.equal(tracked, untracked)
    assert trace.live_nodes == 0


def test_patches_are_put_back_after_a_block():
    before = (torch.jit.trace, torch.jit.trace_module, torch.from_numpy)
    with am.track():
        pass
    assert (torch.jit.trace, torch.jit.trace_module, torch.from_numpy) == before


# ----- 4. the user's own observers see exactly their calls ---------------------------------------
class _Counting(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class _CountingDispatch(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def _small_step() -> None:
    x = torch.ones(3, requires_grad=True)
    y = (x.exp() * 2).sum()
    y.backward()


def _observed(mode_type: type, tracked: bool) -> list[str]:
    with mode_type() as mode:
        if tracked:
            with am.track():
                _small_step()
        else:
            _small_step()
    return mode.calls


def _detach_dispatches_twice() -> bool:
    """True on releases (torch 2.4 to 2.8) where one `Tensor.detach()` reaches a dispatch mode
    as two `aten.detach` calls."""
    x = torch.ones(1, requires_grad=True).exp()
    with _CountingDispatch() as mode:
        x.detach()
    return mode.calls.count("aten.detach.default") == 2


@pytest.mark.parametrize("mode_type", [_Counting, _CountingDispatch])
def test_a_user_mode_around_the_block_sees_only_its_calls(mode_type):
    tracked, untracked = _observed(mode_type, True), _observed(mode_type, False)
    if mode_type is _CountingDispatch and _detach_dispatches_twice():
        # A known difference (README, Supported versions): with hooks set PyTorch skips its own
        # detach of a saved output, and the recorder's stands in for it; where one detach
        # reaches a dispatch mode twice, the user's mode sees one more per saved output (exp's).
        tracked.remove("aten.detach.default")
    assert tracked == untracked


class _Logged(torch.Tensor):
    calls: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def _subclass_calls(tracked: bool, backward: bool) -> list[str]:
    _Logged.calls = []
    x = torch.ones(3, requires_grad=True).as_subclass(_Logged)
    with am.track() if tracked else contextlib.nullcontext():
        y = (x.exp() * 2).sum()
        if backward:
            y.backward()
    return _Logged.calls


def test_a_torch_function_subclass_sees_only_its_calls():
    assert _subclass_calls(True, False) == _subclass_calls(False, False) == ["exp", "mul", "sum"]


def test_a_torch_function_subclass_sees_only_its_backward_call():
    untracked = _subclass_calls(False, True)
    assert untracked == ["exp", "mul", "sum", "backward"]
    assert _subclass_calls(True, True) == untracked


def test_make_fx_graph_is_the_same_tracked():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return (x.exp() * 2).sum()

    x = torch.ones(3)
    untracked = make_fx(f)(x).code
    with am.track():
        tracked = make_fx(f)(x).code
    assert tracked == untracked


def test_fake_tensor_mode_warns_the_same_tracked():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def run(tracked: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with FakeTensorMode():
                x = torch.ones(3, requires_grad=True)
                if tracked:
                    with am.track():
                        (x.exp() * 2).sum().backward()
                else:
                    (x.exp() * 2).sum().backward()
        return [str(w.message) for w in seen]

    assert run(True) == run(False)


# ----- 5. the name walk runs no user code ------------------------------------------------------
_CALLED: list[str] = []


class _LoudList(list):
    def __getitem__(self, index):
        _CALLED.append("list.__getitem__")
        return super().__getitem__(index)

    def __iter__(self):
        _CALLED.append("list.__iter__")
        return super().__iter__()


class _LoudDict(dict):
    def items(self):
        _CALLED.append("dict.items")
        return super().items()


class _Loud:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.kept = tensor

    def __getattribute__(self, name):
        _CALLED.append(f"__getattribute__({name})")
        return object.__getattribute__(self, name)


class _WithProperty:
    @property
    def __dict__(self):
        _CALLED.append("__dict__ property")
        return {}


def test_naming_runs_no_user_code_and_says_what_it_skipped():
    _CALLED.clear()
    x = torch.ones(3, requires_grad=True)
    with am.track() as trace:
        y = x.exp()
        holders = [_LoudList([y]), _LoudDict(a=y), _Loud(y), _WithProperty()]  # noqa: F841
    assert _CALLED == []
    skipped = [b for b in trace.blindspots if b.kind == "naming-skipped"]
    assert len(skipped) == 1 and "_WithProperty" in skipped[0].message
    # Containers are read through the built-in methods, the object through its __dict__ slot.
    paths = [h.path for h in trace.holders]
    assert {"y", "holders[0][0]", "holders[1]['a']", "holders[2].kept"} <= set(paths)


# ----- 6. exceptions come out unchanged ---------------------------------------------------------
class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text")


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise _Unprintable()


def _raise_in_block() -> None:
    raise _Unprintable()


def _raise_in_backward() -> None:
    x = torch.ones(2, requires_grad=True)
    _FailingBackward.apply(x).sum().backward()


@pytest.mark.parametrize("body", [_raise_in_block, _raise_in_backward])
def test_an_exception_whose_text_raises_comes_out_as_the_users_type(body):
    with pytest.raises(_Unprintable), am.track() as trace:
        body()
    assert trace.error is not None and "_Unprintable" in trace.error


DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def _inplace_error(dtype: torch.dtype, tracked: bool) -> str:
    with am.track() if tracked else contextlib.nullcontext():
        x = torch.ones(3, requires_grad=True)
        other = torch.ones(3, dtype=dtype)
        y = x * other if not dtype.is_complex else (x * other).abs()
        if dtype.is_complex:
            other = None
            z = torch.ones(3, dtype=dtype, requires_grad=True)
            y = z.exp()
            y.add_(1)
            loss = y.abs().sum()
        else:
            other.add_(1) if dtype is not torch.bool else other.logical_not_()
            loss = y.sum()
        with pytest.raises(RuntimeError) as caught:
            loss.backward()
    return str(caught.value)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_inplace_error_text_matches_pytorch_for_every_dtype(dtype):
    untracked = _inplace_error(dtype, tracked=False)
    assert "modified by an inplace operation" in untracked
    assert _inplace_error(dtype, tracked=True) == untracked


def _weight_view_written_by_the_optimizer() -> None:
    # addmm inside F.linear saves `weight.t()`; opt.step() writes the weight, so PyTorch names
    # the view's producer as it is after the write (AsStrided), not as it was (T).
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    loss = layer(torch.ones(1, 3, requires_grad=True)).pow(2).sum()
    loss.backward(retain_graph=True)
    opt.step()
    loss.backward()


def _leaf_written_under_no_grad() -> None:
    w = torch.ones(2, 3, requires_grad=True)
    loss = w.sin().sum()
    with torch.no_grad():
        w.mul_(2)
    loss.backward()


def _output_written_under_anomaly_mode() -> None:
    with torch.autograd.set_detect_anomaly(True), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # anomaly mode's forward traceback
        y = torch.ones(4, requires_grad=True).exp()
        loss = y.sum()
        y.add_(1)
        loss.backward()


@pytest.mark.parametrize(
    "case",
    [
        _weight_view_written_by_the_optimizer,
        _leaf_written_under_no_grad,
        _output_written_under_anomaly_mode,
    ],
)
def test_the_inplace_error_is_worded_as_this_torch_words_it(case):
    untracked, _ = _outcome(case, tracked=False)
    assert untracked[0] is RuntimeError and "inplace operation" in untracked[1], untracked
    assert _outcome(case, tracked=True)[0] == untracked


# ----- 9. smaller ones ----------------------------------------------------------------------------
def _softmax_warning(tracked: bool) -> list[tuple[str, int]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with am.track() if tracked else contextlib.nullcontext():
            torch.nn.functional.softmax(torch.ones(2, 3))  # the line warned about
    return [(w.filename, w.lineno) for w in seen]


def test_a_torch_warning_names_the_users_line():
    untracked = _softmax_warning(False)
    assert untracked and untracked[0][0] == __file__
    assert _softmax_warning(True) == untracked


def _once_per_location(tracked: bool) -> int:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        for _ in range(3):
            with am.track() if tracked else contextlib.nullcontext():
                torch.nn.functional.softmax(torch.ones(2, 3))
                torch.nn.functional.softmax(torch.ones(2, 3))  # another location: warns too
    return len(seen)


def test_once_per_location_dedup_is_the_same_tracked():
    assert _once_per_location(True) == _once_per_location(False) == 2


# Both warnings come from PyTorch's C++ code, raised on the frame that called the op.
_CPP_WARNINGS = """
import torch
def step():
    x = torch.ones(3, requires_grad=True)
    y = x * 2
    y.grad
    return torch.tensor(y.detach())
for _ in range(3):
    step()
"""


def _cpp_warnings(
    tracked: bool, action: str, module: str, as_module: bool
) -> list[tuple[str, str, int]]:
    """Warnings seen running `_CPP_WARNINGS` as module `training` (a real module in
    `sys.modules`, or a plain exec namespace) under one filter `action`."""
    training = types.ModuleType("training")
    namespace = training.__dict__ if as_module else {"__name__": "training"}
    code = compile(_CPP_WARNINGS, "training.py", "exec")
    with warnings.catch_warnings(record=True) as seen, _registered(training, as_module):
        warnings.simplefilter("always")
        warnings.filterwarnings(action, module=module)
        for _ in range(2):  # a later block reuses what the first one built
            with am.track() if tracked else contextlib.nullcontext():
                exec(code, namespace)
    return [(str(w.message)[:30], w.filename, w.lineno) for w in seen]


@contextlib.contextmanager
def _registered(module: types.ModuleType, really: bool) -> Iterator[None]:
    if really:
        sys.modules[module.__name__] = module
    try:
        yield
    finally:
        sys.modules.pop(module.__name__, None)


@pytest.mark.parametrize("as_module", [True, False], ids=["module", "exec namespace"])
@pytest.mark.parametrize(
    ("action", "module", "expected"),
    [
        ("always", "training", 12),
        ("once", "training", 2),
        ("ignore", "training", 0),
        ("ignore", "autograd_magic", 12),
    ],
)
def test_a_warning_from_torch_cpp_code_lands_on_the_callers_line(
    action, module, expected, as_module
):
    untracked = _cpp_warnings(False, action, module, as_module)
    assert len(untracked) == expected
    assert {w[1:] for w in untracked} <= {("training.py", 6), ("training.py", 7)}
    assert _cpp_warnings(True, action, module, as_module) == untracked


def _line_events(tracked: bool) -> list[tuple[str, int]]:
    """The line events a debugger (sys.settrace) sees in `training.py` while it runs."""
    events: list[tuple[str, int]] = []

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename != "training.py":
            return None
        if event == "line":
            events.append((frame.f_code.co_name, frame.f_lineno))
        return tracer

    code = compile(_CPP_WARNINGS, "training.py", "exec")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with am.track() if tracked else contextlib.nullcontext():
            sys.settrace(tracer)
            try:
                exec(code, {"__name__": "training"})
            finally:
                sys.settrace(None)
    return events


def test_a_debugger_sees_each_line_of_the_users_code_once():
    # A breakpoint on a line with a torch call must not hit a second time inside the recorder.
    untracked = _line_events(False)
    assert ("step", 6) in untracked
    assert _line_events(True) == untracked


_PROFILED = """
import torch
def step():
    x = torch.ones(3, requires_grad=True)
    y = (x * 2).exp().sum()
    y.backward()
    return torch.tensor(y.detach())
for _ in range(3):
    step()
"""


def _profiled_functions(tracked: bool) -> tuple[set[str], list[str]]:
    """The functions of `training.py` that cProfile lists, and the names of every function a
    `sys.setprofile` hook sees called from there."""
    called: list[str] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == "training.py":
            called.append(frame.f_code.co_name)

    profile = cProfile.Profile()
    code = compile(_PROFILED, "training.py", "exec")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with am.track() if tracked else contextlib.nullcontext():
            with profile:
                exec(code, {"__name__": "training"})
            sys.setprofile(hook)
            try:
                exec(code, {"__name__": "training"})
            finally:
                sys.setprofile(None)
    listed = {name for file, _, name in pstats.Stats(profile).stats if file == "training.py"}
    return listed, called


def test_a_profiler_lists_the_same_functions_of_the_users_file_as_untracked():
    """GIVEN cProfile or a sys.setprofile hook WHEN a small training step runs tracked THEN it
    lists the user's own functions, as untracked, and no stand-in frame of the recorder."""
    untracked = _profiled_functions(False)
    assert untracked == ({"<module>", "step"}, ["<module>", "step", "step", "step"])
    assert _profiled_functions(True) == untracked


def test_a_profiler_set_for_new_threads_sees_no_stand_in():
    """GIVEN threading.setprofile WHEN a thread started then runs a tracked step THEN its
    profile function sees no stand-in frame (the thread's own sys.getprofile is set)."""
    called: list[str] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            called.append(frame.f_code.co_name)

    def work() -> None:
        with am.track():
            x = torch.ones(3, requires_grad=True)
            (x * 2).exp().sum().backward()

    threading.setprofile(hook)
    try:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    assert "work" in called and "autograd_magic_call" not in called


def _view_error_entries(tracked: bool) -> list[str]:
    x = torch.ones(3)
    with (
        pytest.raises(RuntimeError) as caught,
        am.track() if tracked else contextlib.nullcontext(),
    ):
        x.view(2, 2)
    return traceback.format_tb(caught.value.__traceback__)


def test_a_traceback_through_a_stand_in_shows_the_users_line_as_untracked():
    # The stand-in (which carries the user's line) is taken out as the error leaves the block:
    # the user's line is the last entry, with untracked's carets.
    tracked = _view_error_entries(True)
    assert not [e for e in tracked if "in autograd_magic_call" in e]
    assert tracked == _view_error_entries(False)


def _exec_namespace_dropped(tracked: bool) -> list[str]:
    log: list[str] = []
    with am.track() if tracked else contextlib.nullcontext():
        namespace: dict[str, Any] = {"torch": torch}
        exec("x = torch.ones(3, requires_grad=True)\ny = x.exp()", namespace)
        weakref.finalize(namespace["y"], log.append, "y freed")
        del namespace
        log.append("namespace dropped")
    return log


def test_a_dropped_exec_namespace_frees_its_tensors_at_once(gc_disabled):
    # The stand-in for `x.exp()` runs with that namespace as globals: it must not keep it.
    assert _exec_namespace_dropped(True) == _exec_namespace_dropped(False)
    assert _exec_namespace_dropped(False) == ["y freed", "namespace dropped"]


def test_an_error_in_a_builtin_op_names_the_users_line_and_function():
    x = torch.ones(3)
    with pytest.raises(RuntimeError) as caught, am.track() as trace:
        x.view(2, 2)  # the failing line
    assert "shape '[2, 2]' is invalid" in str(caught.value)
    site = trace.error_site
    assert site is not None
    assert (site.file, site.function) == (__file__, sys._getframe().f_code.co_name)
    assert site.line == sys._getframe().f_lineno - 5


@pytest.mark.xfail(strict=True, reason="with saved-tensor hooks set, PyTorch wraps every unpack")
def test_a_saved_leaf_unpacks_as_the_same_object():
    x = torch.ones(3, requires_grad=True)
    with am.track():
        assert x.sin().grad_fn._saved_self is x


def _anomaly_stack(tracked: bool) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly(), am.track() if tracked else contextlib.nullcontext():
            x = torch.ones(2, 3, requires_grad=True)
            y = torch.nn.functional.softmax(x.exp(), dim=1)
    entries = (
        y.grad_fn.metadata["traceback_"] + y.grad_fn.next_functions[0][0].metadata["traceback_"]
    )
    # Frames only (file, function): the two runs are called from different lines of this file.
    heads = [e.splitlines()[0] for e in entries]
    return [h.split(", line")[0] + h.split(",")[-1] for h in heads]


def test_anomaly_mode_forward_stack_shows_no_recorder_frames():
    assert _anomaly_stack(True) == _anomaly_stack(False)


def _block_inside_disabled_hooks() -> torch.Tensor:
    x = torch.ones(3, requires_grad=True)
    with torch.autograd.graph.disable_saved_tensors_hooks("no hooks here"), am.track():
        y = x.exp().sum()
    y.backward()
    return x.grad


def _block_inside_grad() -> torch.Tensor:
    def f(t: torch.Tensor) -> torch.Tensor:
        with am.track():
            return (t.sin() * t).sum()

    return torch.func.grad(f)(torch.arange(3.0))


@pytest.mark.parametrize("body", [_block_inside_disabled_hooks, _block_inside_grad])
def test_a_block_entered_where_hooks_are_refused_runs(body):
    untracked = _outcome(lambda: _strip_tracking(body), tracked=False)[0]
    assert _same(body(), untracked)


def _strip_tracking(body: Callable[[], Any]) -> Any:
    real = am.track
    am.track = contextlib.nullcontext  # type: ignore[assignment]
    try:
        return body()
    finally:
        am.track = real


def test_uninstall_removes_a_block_whose_exit_never_ran():
    # GIVEN a block entered whose __exit__ never ran (an interrupt as the block ended)
    import numpy as np
    from torch.overrides import _get_current_function_mode_stack

    original_from_numpy = torch.from_numpy
    recorder = am.track()
    recorder.__enter__()
    assert _get_current_function_mode_stack()
    assert torch.from_numpy is not original_from_numpy
    # WHEN the user calls uninstall()
    removed = am.uninstall()
    # THEN it says one block was removed and nothing of the recorder is left installed
    assert removed == 1
    assert not _get_current_function_mode_stack()
    assert no_saved_hooks()
    assert torch.from_numpy is original_from_numpy
    assert torch.from_numpy(np.ones(2)).sum().item() == 2.0
    assert am.uninstall() == 0


def test_tracking_leaves_autograd_sequence_numbers_as_they_are():
    """GIVEN an op run untracked and the same op run in a block WHEN their nodes' sequence
    numbers (what anomaly mode and profilers order nodes by) are compared to the thread's
    counter before each THEN both nodes got the next number: the block made no node of its own
    (it once took one with a probe node per block)."""
    x = torch.ones(2, requires_grad=True)
    peek = torch._C._autograd._get_sequence_nr
    start = peek()
    untracked = x * 2
    offsets = [untracked.grad_fn._sequence_nr() - start]
    start = peek()
    with am.track():
        tracked = x * 2
    offsets.append(tracked.grad_fn._sequence_nr() - start)
    assert offsets == [0, 0]


def test_the_fallback_probe_reads_the_same_sequence_number(monkeypatch):
    """GIVEN a torch without `_get_sequence_nr` (the probe node is used) WHEN the next number is
    read THEN it is the one PyTorch's counter held (the probe took it; the counter moved on)."""
    from autograd_magic.recorder import nodes

    monkeypatch.setattr(nodes, "_peek_sequence_nr", None)
    before = torch._C._autograd._get_sequence_nr()
    assert nodes.current_sequence_nr() == before
    assert torch._C._autograd._get_sequence_nr() == before + 1


# ----- a saved input is held as autograd holds it: its TensorImpl, not its Python object -----
# (issue 31, item 1: PyTorch's use-count guard, refcounts and the object read back in backward)


def _swap_a_saved_input() -> Any:
    a = torch.ones(3, requires_grad=True)
    b = torch.tensor([1.0, 2.0, 3.0])
    out = (a * b).sum()
    torch.utils.swap_tensors(b, torch.zeros(3))  # untracked: refused, b is saved for backward
    out.backward()
    return a.grad


def _load_state_dict_with_swap_between_forward_and_backward() -> Any:
    was = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model = torch.nn.Linear(3, 2)
        loss = model(torch.ones(1, 3)).sum()
        model.load_state_dict({k: torch.zeros_like(v) for k, v in model.state_dict().items()})
        loss.backward()
        return model.weight.grad
    finally:
        torch.__future__.set_swap_module_params_on_conversion(was)


@pytest.mark.parametrize(
    "case", [_swap_a_saved_input, _load_state_dict_with_swap_between_forward_and_backward]
)
def test_swapping_a_tensor_saved_for_backward_is_refused_as_untracked(case, gc_disabled):
    untracked, _ = _outcome(case, tracked=False)
    tracked, _ = _outcome(case, tracked=True)
    assert isinstance(untracked, tuple) and untracked[0] is RuntimeError, untracked
    assert tracked == untracked


def _saved_input_counts(tracked: bool) -> tuple[int, int]:
    b = torch.tensor([1.0, 2.0, 3.0])
    with am.track() if tracked else contextlib.nullcontext():
        a = torch.ones(3, requires_grad=True)
        out = (a * b).sum()
        counts = (sys.getrefcount(b), b._use_count())
    del out
    return counts


def test_a_saved_input_has_the_refcount_and_use_count_it_has_untracked(gc_disabled):
    assert _saved_input_counts(tracked=True) == _saved_input_counts(tracked=False)


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        _Scale.seen = (type(weight).__name__, getattr(weight, "note", None))
        return grad * weight, grad * x


def test_a_custom_backward_reads_back_what_any_saved_tensor_hooks_give(gc_disabled):
    """A known difference (README, Limits): with any saved-tensor hooks set, PyTorch unpacks a
    saved tensor as a new plain Tensor, so a saved Parameter comes back without the attributes
    the user set on it. Tracked gives exactly what an identity `saved_tensors_hooks` gives."""

    def run(context: Any) -> tuple:
        weight = torch.nn.Parameter(torch.ones(3))
        weight.note = "mine"
        with context:
            _Scale.apply(torch.ones(3, requires_grad=True), weight).sum().backward()
        return _Scale.seen

    assert run(contextlib.nullcontext()) == ("Parameter", "mine")
    identity = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    assert run(am.track()) == run(identity) == ("Tensor", None)


_IMPORT_DYNAMO_ON_ANOTHER_THREAD = """
import threading, torch, autograd_magic as am
errors = []
def build_optimizer():
    try:
        torch.optim.Adam([torch.nn.Parameter(torch.ones(2))])
        import torch._dynamo as dynamo  # what building an optimizer imports first
    except BaseException as error:
        errors.append(repr(error))
other = threading.Thread(target=build_optimizer)
x = torch.ones(3, requires_grad=True)
with am.track():
    other.start()
    i = 0
    while other.is_alive():  # a new call site each time, so the recorder makes a new stand-in
        try:
            exec(compile(f"y = (x * {i}).sin()", f"<site {i}>", "exec"), {"x": x})
        except BaseException as error:
            errors.append(repr(error))
            break
        i += 1
other.join()
print(errors)
"""


@pytest.mark.slow
def test_a_thread_importing_dynamo_while_a_block_runs_is_left_alone():
    """GIVEN a block making new call sites WHEN another thread imports torch._dynamo for the
    first time THEN neither thread sees an error (was: ImportError of `skip_code` from the
    partially initialized eval_frame, in both threads, 3 of 3 runs). Issue 31, item 3."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_DYNAMO_ON_ANOTHER_THREAD],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def _profiled_op_counts(tracked: bool) -> dict[str, int]:
    with am.track() if tracked else contextlib.nullcontext():
        x = torch.ones(3, requires_grad=True)
        with torch.profiler.profile() as prof:
            loss = x.exp().tanh().sigmoid().sum()  # each saves its output
            loss.backward()
    return {e.key: e.count for e in prof.key_averages() if e.key.startswith("aten::")}


def test_a_profiler_counts_the_same_ops_tracked():
    """The recorder's alias of a saved output (what autograd keeps of it) is no op a profiler
    lists: was one extra aten::detach per saved output (issue 31, item 8)."""
    untracked = _profiled_op_counts(tracked=False)
    assert untracked["aten::exp"] == 1
    assert _profiled_op_counts(tracked=True) == untracked


_FORK_JOIN = """
import sys, torch, autograd_magic as am

@torch.jit.script
def branch(middle, orig_x):
    y = middle + middle**2
    return torch.autograd.grad([y.sum()], [orig_x], retain_graph=True)

@torch.jit.script
def fork_join(x):
    y = (x + 3) * (x + 4) * 0.5
    future = torch.jit._fork(branch, y, x)
    here = branch(y, x)
    return torch.jit._wait(future), here

def run():
    try:
        return str(fork_join(torch.ones(2, requires_grad=True))[0][0].tolist())
    except RuntimeError as error:
        return f"RuntimeError {str(error).splitlines()[-1:]!r}"

print(run())
with am.track():
    print(run())
"""


def test_a_tensor_saved_on_a_thread_with_no_python_caller_is_recorded(tmp_path):
    """A TorchScript fork saves tensors on a JIT worker thread: the pack hook has no Python
    frame above it (was: ValueError 'call stack is not deep enough', which the JIT reported as
    an empty RuntimeError). From PyTorch's test_fork_join_in_middle; issue 31's suites."""
    script = tmp_path / "fork_join.py"  # TorchScript reads the functions' source
    script.write_text(_FORK_JOIN)
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert done.stdout.splitlines() == ["[94.5, 94.5]"] * 2, done.stdout + done.stderr
