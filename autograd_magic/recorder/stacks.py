"""This block's entries in torch's per-thread stacks (function modes, saved-tensor hooks): put in
where they must sit, and taken out wherever they sit now, leaving every other entry in place.

Removal is idempotent, so a removal cut short by an interrupt can simply run again; hooks left
on a thread by a block that ended on another wait there for that thread (`strand`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from autograd_magic.recorder import torch_api

_PACKAGE = __name__.partition(".")[0] + "."


def remove_mode(mode: Any) -> None:
    """Take `mode` out of this thread's function mode stack, leaving every other mode in place."""
    stack = torch_api.function_mode_stack()
    if not any(m is mode for m in stack):
        return
    above = []
    while True:
        top = torch_api.pop_function_mode()
        if top is mode:
            break
        above.append(top)
    for other in reversed(above):
        torch_api.push_function_mode(other)


def user_hooks() -> bool:
    """True when saved-tensor hooks other than the blocks' own are on this thread's stack
    (False where torch cannot show the stack: torch 2.4)."""
    if not torch_api.HAS_TOP_SAVED_HOOKS:
        return False
    popped = []
    while (top := torch_api.top_saved_hooks()) is not None:
        torch_api.pop_saved_hooks()
        popped.append(top)
    for pack_hook, unpack_hook in reversed(popped):
        torch_api.push_saved_hooks(pack_hook, unpack_hook)
    return not all(_is_ours(pack) for pack, _ in popped)


def _is_ours(pack: Any) -> bool:
    """Whether a pack hook is a block's: a function of this package, or a compiled one."""
    module = getattr(pack, "__module__", None) or type(pack).__module__
    return str(module).startswith(_PACKAGE)


def remove_hooks(pack: Callable[..., Any]) -> None:
    """Take the saved-tensor hooks whose pack hook is `pack` out of this thread's hook stack.

    Where torch cannot show the stack (torch 2.4), the top entry is taken if this thread pushed
    `pack` and has not taken it off yet: the block's own, as long as the saved-tensor hooks
    contexts opened in the block were also closed in it."""
    if not torch_api.HAS_TOP_SAVED_HOOKS:
        pushed = _pushed.get(threading.get_ident(), [])
        if any(p is pack for p in pushed):
            pushed.reverse()
            pushed.remove(pack)
            pushed.reverse()
            torch_api.pop_saved_hooks()
        return
    above = []
    while True:
        top = torch_api.top_saved_hooks()
        if top is None:
            break  # not found: everything popped goes back as it was
        torch_api.pop_saved_hooks()
        if top[0] is pack:
            break
        above.append(top)
    for pack_hook, unpack_hook in reversed(above):
        torch_api.push_saved_hooks(pack_hook, unpack_hook)


# Pack hooks of blocks that ended on another thread than the one they began on, by that first
# thread, which alone can take them off its stack. (Their modes have ended: `purge_ended_modes`
# removes those.)
_stranded: dict[int, list[Callable[..., Any] | None]] = {}


def strand(thread: int, pack: Callable[..., Any] | None) -> None:
    """Leave `pack`'s hooks for `thread` to remove (see `remove_stranded_hooks`)."""
    _stranded.setdefault(thread, []).append(pack)


def remove_stranded_hooks() -> None:
    """Take the hooks stranded on this thread off its stack; their blocks stay listed for
    `purge_stranded` to count."""
    packs = _stranded.get(threading.get_ident(), [])
    for index, pack in enumerate(packs):
        if pack is not None:
            remove_hooks(pack)
            packs[index] = None


def purge_stranded() -> int:
    """Remove the hooks stranded on this thread; returns how many blocks left some."""
    remove_stranded_hooks()
    return len(_stranded.pop(threading.get_ident(), ()))


def push_hooks(pack: Callable[..., Any], unpack: Callable[..., Any]) -> None:
    """Install saved-tensor hooks the way `saved_tensors_hooks.__enter__` does."""
    torch_api.push_saved_hooks(pack, unpack)
    if not torch_api.HAS_TOP_SAVED_HOOKS:
        _pushed.setdefault(threading.get_ident(), []).append(pack)


# Where torch cannot show the hook stack (torch 2.4): the pack hooks each thread pushed and has
# not taken off, oldest first.
_pushed: dict[int, list[Callable[..., Any]]] = {}


def purge_ended_modes(mode_type: type) -> None:
    """Remove modes of `mode_type` whose block has ended (`recorder` is None) from the stack.

    torch puts a mode back on the stack when a `_pop_mode_temporarily` interrupted by a
    KeyboardInterrupt is finally closed, possibly after the block ended; such a mode only
    forwards calls, and the next block takes it out.
    """
    for mode in torch_api.function_mode_stack():
        if type(mode) is mode_type and getattr(mode, "recorder", None) is None:
            remove_mode(mode)


def push_mode_innermost(mode: Any) -> None:
    """Put `mode` under every function mode already active on this thread.

    Torch calls reach the innermost mode last, with every mode above it set aside: the
    recorder's own bookkeeping there is invisible to the user's modes, which see exactly the
    calls they see untracked. A `DeviceContext` (`torch.set_default_device`) stays at the bottom,
    where PyTorch requires it to be (torch 2.4 stacks it like any mode: there it stays above
    ours, see `torch_api.DEVICE_CONTEXT_AT_BOTTOM`).
    """
    above = []
    while torch_api.function_mode_stack():
        above.append(torch_api.pop_function_mode())
    bottom = (
        above.pop()
        if above
        and isinstance(above[-1], torch_api.DeviceContext)
        and torch_api.DEVICE_CONTEXT_AT_BOTTOM
        else None
    )
    try:
        if bottom is not None:
            torch_api.push_function_mode(bottom)
        torch_api.push_function_mode(mode)
    finally:
        for other in reversed(above):
            torch_api.push_function_mode(other)
