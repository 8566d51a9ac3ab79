"""What a block installs into torch, and taking exactly that back out, in any order.

Blocks may end out of order (two generators each holding a `with track():`), and a
KeyboardInterrupt may arrive between any two steps. So removal inspects what is actually
installed and takes out only this block's own entries, wherever they sit in torch's stacks; it
is idempotent, so a removal cut short can simply run again. The two patched entry points
(`torch.from_numpy`, `saved_tensors_hooks.__enter__`) are installed once, shared by every
active block, and hold no recorder: a patch outliving its blocks forwards and records nothing.
"""

from __future__ import annotations

import bdb
import sys
import warnings
import weakref
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, Protocol

import torch
import torch.fx.traceback
from torch.overrides import TorchFunctionMode

from autograd_magic.model.records import BlindspotKind
from autograd_magic.recorder import deferred, dynamo, stacks, torch_api, warnings_site
from autograd_magic.recorder.frames import DISPATCH_TO_MODES, is_recorder

# Each patch, traced by torch.compile, is the original call and nothing else (see `dynamo`):
# its first statement, so Dynamo meets no call it cannot trace before it.
_is_compiling = torch.compiler.is_compiling
_HOOKS_CLASS = torch.autograd.graph.saved_tensors_hooks


class Patched(Protocol):
    """What the shared patches call on each active block."""

    def from_numpy_made(self, tensor: torch.Tensor, array: Any) -> None: ...

    def user_hooks_entered(self) -> None: ...

    def suspend(self, kind: BlindspotKind, message: str) -> bool: ...

    def resume(self) -> None: ...

    def forget(self, obj: Any) -> None: ...


_active: list[weakref.ref[Patched]] = []
_originals: dict[str, Any] = {}


def _live_blocks() -> list[Patched]:
    return [block for ref in list(_active) if (block := ref()) is not None]


def live_blocks() -> list[Patched]:
    """Every block whose patches are still installed (running, or left by an interrupt)."""
    return _live_blocks()


def _from_numpy(array: Any) -> torch.Tensor:
    if _is_compiling():
        return _originals["from_numpy"](array)
    tensor = _originals["from_numpy"](array)
    for block in _live_blocks():
        block.from_numpy_made(tensor, array)
    return tensor


def _hooks_enter(hooks: Any) -> Any:
    if _is_compiling():
        return _originals["hooks_enter"](hooks)
    for block in _live_blocks():
        block.user_hooks_entered()
    return _originals["hooks_enter"](hooks)


def _hooks_disable(message: str) -> None:
    # PyTorch refuses saved-tensor hooks here (torch.func transforms, user code): ours step
    # aside until hooks are enabled again, and the trace says what it did not see.
    if _is_compiling():
        return _originals["hooks_disable"](message)
    if torch_api.hooks_disabled_message() is None and not stacks.user_hooks():
        # (With the user's hooks set, PyTorch refuses to disable: ours stay where they are.)
        kind: BlindspotKind = "torch.func" if message.startswith("torch.func") else "hooks-disabled"
        for block in _live_blocks():
            if block.suspend(kind, DISABLED_MESSAGES[kind]):
                _suspended.append(weakref.ref(block))
    _originals["hooks_disable"](message)


def _hooks_enable() -> None:
    if _is_compiling():
        return _originals["hooks_enable"]()
    _originals["hooks_enable"]()
    while _suspended:
        block = _suspended.pop(0)()
        if block is not None and any(ref() is block for ref in _active):
            block.resume()


def _swap_tensors(t1: Any, t2: Any) -> Any:
    # swap_tensors refuses tensors with weak references: the blocks let go of theirs first.
    if _is_compiling():
        return _originals["swap_tensors"](t1, t2)
    for block in _live_blocks():
        block.forget(t1)
        block.forget(t2)
    return _originals["swap_tensors"](t1, t2)


class BlockMode(TorchFunctionMode):
    """Base of the recorder's function mode: the modes this module recognizes as a block's."""


def _only_block_modes(stack: list[Any]) -> bool:
    """True when every function mode on `stack` is a block's (an empty stack too)."""
    return all(isinstance(mode, BlockMode) for mode in stack)


def _has_torch_function(relevant_args: Any) -> bool:
    # Library code asks this to choose an algorithm (the fast paths of nn.MultiheadAttention and
    # nn.TransformerEncoderLayer under eval + no_grad): it gets the answer it gets untracked.
    # (Dispatch sites bind the builtin at import and still route calls through the mode.)
    answer = _ORIGINAL_HAS_TORCH_FUNCTION(relevant_args)
    if not answer or _is_compiling():
        return answer
    stack = torch_api.function_mode_stack()
    if not stack or not _only_block_modes(stack):
        return True  # another mode is there: the answer is True with or without ours
    modes = [torch_api.pop_function_mode() for _ in stack]
    try:
        return _ORIGINAL_HAS_TORCH_FUNCTION(relevant_args)
    finally:
        for mode in reversed(modes):
            torch_api.push_function_mode(mode)


def _stop_here(debugger: bdb.Bdb, frame: FrameType) -> bool:
    # pdb and IPython's debugger step over the recorder (its hooks run inside torch calls and
    # module calls) as they step over a builtin untracked, and over torch's dispatch to it. What
    # the user's call runs (a Python torch function, a backward hook) is still stepped into: the
    # first recorder frame above it is one that only passes the call on.
    caller: FrameType | None = frame
    while caller is not None:
        code = caller.f_code
        if code is DISPATCH_TO_MODES:
            if _only_block_modes(torch_api.function_mode_stack()):
                return False
            break
        if is_recorder(caller):
            if caller is frame or code not in PASS_THROUGH:
                return False
            break
        caller = caller.f_back
    return _ORIGINAL_STOP_HERE(debugger, frame)


# Code of the recorder's frames that call the user's function and nothing else around it.
PASS_THROUGH: set[CodeType] = set()


def _unraisable(unraisable: Any) -> None:
    # An interrupt delivered as one of our finalizers starts is held for later (see deferred);
    # everything else goes to the hook that was there.
    try:
        if not deferred.took(unraisable):
            _originals["unraisablehook"](unraisable)
    except Exception:
        raise
    except BaseException as error:  # a second interrupt, landing in here: held as well
        deferred.hold(error)


def _jit_tracer(name: str) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return _originals[name](*args, **kwargs)
        # The tracer records every Python frame on the stack (ours would be baked into the
        # graph and differ between runs): the blocks step aside while it traces.
        resumed = [b for b in _live_blocks() if b.suspend("jit.trace", _JIT_MESSAGE)]
        try:
            return _originals[name](*args, **kwargs)
        finally:
            for block in resumed:
                block.resume()

    run.__name__ = run.__qualname__ = name
    run.__doc__ = _ORIGINAL_JIT[name].__doc__
    return run


_suspended: list[weakref.ref[Patched]] = []
_ORIGINAL_FROM_NUMPY = torch.from_numpy
_ORIGINAL_STOP_HERE = bdb.Bdb.stop_here
_ORIGINAL_HAS_TORCH_FUNCTION = torch.overrides.has_torch_function
_ORIGINAL_HOOKS_ENTER = _HOOKS_CLASS.__enter__
_ORIGINAL_HOOKS_DISABLE = getattr(torch_api.AUTOGRAD_C, torch_api.SAVED_HOOKS_DISABLE)
_ORIGINAL_HOOKS_ENABLE = getattr(torch_api.AUTOGRAD_C, torch_api.SAVED_HOOKS_ENABLE)
_ORIGINAL_JIT = {"trace": torch.jit.trace, "trace_module": torch.jit.trace_module}
_JIT = {name: _jit_tracer(name) for name in _ORIGINAL_JIT}
DISABLED_MESSAGES = {
    "torch.func": (
        "A torch.func transform (grad, vjp, jacrev, hessian) ran at line {line}: PyTorch allows "
        "no saved-tensor hooks inside it, so the tensors it saved were not seen."
    ),
    "hooks-disabled": (
        "Saved-tensor hooks were disabled at line {line} "
        "(torch.autograd.graph.disable_saved_tensors_hooks): tensors saved there were not seen."
    ),
}
_JIT_MESSAGE = (
    "torch.jit.trace ran at line {line}: what it ran while tracing was not recorded (the tracer "
    "would have recorded autograd_magic's frames into the traced graph)."
)
# (owner, attribute, our replacement, key in _originals)
_PATCHES: list[tuple[Any, str, Any, str]] = [
    (torch, "from_numpy", _from_numpy, "from_numpy"),
    (_HOOKS_CLASS, "__enter__", _hooks_enter, "hooks_enter"),
    (torch_api.AUTOGRAD_C, torch_api.SAVED_HOOKS_DISABLE, _hooks_disable, "hooks_disable"),
    (torch_api.AUTOGRAD_C, torch_api.SAVED_HOOKS_ENABLE, _hooks_enable, "hooks_enable"),
    (torch.jit, "trace", _JIT["trace"], "trace"),
    (torch.jit, "trace_module", _JIT["trace_module"], "trace_module"),
    (warnings, "warn", warnings_site.warn, "warn"),
    (torch.utils, "swap_tensors", _swap_tensors, "swap_tensors"),
    (torch.fx.traceback, "format_stack", warnings_site.format_stack, "format_stack"),
    (torch.overrides, "has_torch_function", _has_torch_function, "has_torch_function"),
    (bdb.Bdb, "stop_here", _stop_here, "stop_here"),
    (sys, "unraisablehook", _unraisable, "unraisablehook"),
]
_DEFAULTS = {
    "from_numpy": _ORIGINAL_FROM_NUMPY,
    "hooks_enter": _ORIGINAL_HOOKS_ENTER,
    "hooks_disable": _ORIGINAL_HOOKS_DISABLE,
    "hooks_enable": _ORIGINAL_HOOKS_ENABLE,
    **_ORIGINAL_JIT,
    "warn": warnings_site.ORIGINAL_WARN,
    "swap_tensors": torch.utils.swap_tensors,
    "format_stack": warnings_site.ORIGINAL_FORMAT_STACK,
    "has_torch_function": _ORIGINAL_HAS_TORCH_FUNCTION,
    "stop_here": _ORIGINAL_STOP_HERE,
    "unraisablehook": sys.unraisablehook,
}


# The name of the newest module imported when the patches went in (see `_unbind_patches`).
_last_module_before: list[str] = []


def add_patches(block: Patched) -> None:
    """Route `torch.from_numpy` and user saved-tensor hooks to `block` until `remove_patches`."""
    dynamo.keep_out(_with_originals)  # before patching: Dynamo must learn the originals
    if not _active:
        _last_module_before[:] = [next(reversed(sys.modules), "")]
    for owner, attribute, ours, key in _PATCHES:
        current = getattr(owner, attribute)
        if current is not ours:
            _originals[key] = current
            setattr(owner, attribute, ours)
    if not any(ref() is block for ref in _active):
        _active.append(weakref.ref(block))


def _with_originals(run: Callable[[], None]) -> None:
    """Call `run` with torch's original entry points back in place of the installed patches."""
    swapped = []
    try:
        for owner, attribute, ours, key in _PATCHES:
            if getattr(owner, attribute) is ours:
                setattr(owner, attribute, _originals.get(key, _DEFAULTS[key]))
                swapped.append((owner, attribute, ours))
        run()
    finally:
        for owner, attribute, ours in swapped:
            setattr(owner, attribute, ours)


def remove_patches(block: Patched) -> None:
    """Stop routing to `block`; with no block left, put back what was there (unless replaced)."""
    _active[:] = [ref for ref in _active if ref() is not None and ref() is not block]
    if _active:
        return
    dynamo.stop_watching()
    for owner, attribute, ours, key in _PATCHES:
        if getattr(owner, attribute) is ours:
            setattr(owner, attribute, _originals.get(key, _DEFAULTS[key]))
    _unbind_patches()


def _unbind_patches() -> None:
    """A module imported while the patches were in that bound one of them by name (a library's
    `from warnings import warn`) gets the original: it would keep the replacement for good."""
    originals = {
        id(ours): (ours, _originals.get(key, _DEFAULTS[key])) for _, _, ours, key in _PATCHES
    }
    marker = _last_module_before[0] if _last_module_before else ""
    for name in reversed(list(sys.modules)):  # newest first: imports are appended
        if name == marker:
            break
        namespace = getattr(sys.modules.get(name), "__dict__", None)
        if type(namespace) is not dict:
            continue
        for attribute, value in list(namespace.items()):
            found = originals.get(id(value))
            if found is not None and found[0] is value:
                namespace[attribute] = found[1]


def hooks_disabled_message() -> str | None:
    """The error PyTorch raises for saved-tensor hooks here, or None where they are allowed."""
    return torch_api.hooks_disabled_message()


def suspended_until_enabled(block: Patched) -> None:
    """Have `block.resume()` called when saved-tensor hooks are enabled again."""
    _suspended.append(weakref.ref(block))
