"""What a block installs into torch, and taking exactly that back out, in any order.

Blocks may end out of order (two generators each holding a `with track():`), and a
KeyboardInterrupt may arrive between any two steps. So removal inspects what is actually
installed and takes out only this block's own entries, wherever they sit in torch's stacks; it
is idempotent, so a removal cut short can simply run again. The two patched entry points
(`torch.from_numpy`, `saved_tensors_hooks.__enter__`) are installed once, shared by every
active block, and hold no recorder: a patch outliving its blocks forwards and records nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.overrides import _get_current_function_mode_stack, _pop_mode, _push_mode

_autograd = torch._C._autograd
_HOOKS_CLASS = torch.autograd.graph.saved_tensors_hooks


class Patched(Protocol):
    """What the shared patches call on each active block."""

    def from_numpy_made(self, tensor: torch.Tensor, array: Any) -> None: ...

    def user_hooks_entered(self) -> None: ...


_active: list[weakref.ref[Patched]] = []
_originals: dict[str, Any] = {}


def _live_blocks() -> list[Patched]:
    return [block for ref in list(_active) if (block := ref()) is not None]


def _from_numpy(array: Any) -> torch.Tensor:
    tensor = _originals.get("from_numpy", _ORIGINAL_FROM_NUMPY)(array)
    for block in _live_blocks():
        block.from_numpy_made(tensor, array)
    return tensor


def _hooks_enter(hooks: Any) -> Any:
    for block in _live_blocks():
        block.user_hooks_entered()
    return _originals.get("hooks_enter", _ORIGINAL_HOOKS_ENTER)(hooks)


_ORIGINAL_FROM_NUMPY = torch.from_numpy
_ORIGINAL_HOOKS_ENTER = _HOOKS_CLASS.__enter__


def add_patches(block: Patched) -> None:
    """Route `torch.from_numpy` and user saved-tensor hooks to `block` until `remove_patches`."""
    if torch.from_numpy is not _from_numpy:
        _originals["from_numpy"] = torch.from_numpy
        torch.from_numpy = _from_numpy
    if _HOOKS_CLASS.__enter__ is not _hooks_enter:
        _originals["hooks_enter"] = _HOOKS_CLASS.__enter__
        _HOOKS_CLASS.__enter__ = _hooks_enter
    if not any(ref() is block for ref in _active):
        _active.append(weakref.ref(block))


def remove_patches(block: Patched) -> None:
    """Stop routing to `block`; with no block left, put back what was there (unless replaced)."""
    _active[:] = [ref for ref in _active if ref() is not None and ref() is not block]
    if _active:
        return
    if torch.from_numpy is _from_numpy:
        torch.from_numpy = _originals.get("from_numpy", _ORIGINAL_FROM_NUMPY)
    if _HOOKS_CLASS.__enter__ is _hooks_enter:
        _HOOKS_CLASS.__enter__ = _originals.get("hooks_enter", _ORIGINAL_HOOKS_ENTER)


def remove_mode(mode: Any) -> None:
    """Take `mode` out of this thread's function mode stack, leaving every other mode in place."""
    stack = _get_current_function_mode_stack()
    if not any(m is mode for m in stack):
        return
    above = []
    while True:
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    for other in reversed(above):
        _push_mode(other)


def remove_hooks(pack: Callable[..., Any]) -> None:
    """Take the saved-tensor hooks whose pack hook is `pack` out of this thread's hook stack."""
    above = []
    while True:
        top = _autograd._top_saved_tensors_default_hooks(True)
        if top is None:
            break  # not found: everything popped goes back as it was
        _autograd._pop_saved_tensors_default_hooks()
        if top[0] is pack:
            break
        above.append(top)
    for pack_hook, unpack_hook in reversed(above):
        _autograd._push_saved_tensors_default_hooks(pack_hook, unpack_hook)


def push_hooks(pack: Callable[..., Any], unpack: Callable[..., Any]) -> None:
    """Install saved-tensor hooks the way `saved_tensors_hooks.__enter__` does."""
    _autograd._push_saved_tensors_default_hooks(pack, unpack)


def purge_ended_modes(mode_type: type) -> None:
    """Remove modes of `mode_type` whose block has ended (`recorder` is None) from the stack.

    torch puts a mode back on the stack when a `_pop_mode_temporarily` interrupted by a
    KeyboardInterrupt is finally closed, possibly after the block ended; such a mode only
    forwards calls, and the next block takes it out.
    """
    for mode in _get_current_function_mode_stack():
        if type(mode) is mode_type and mode.recorder is None:
            remove_mode(mode)
