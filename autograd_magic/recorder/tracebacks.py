"""What an error passing through the recorder shows of it: nothing.

Tools that print tracebacks (IPython, pytest) leave out frames whose locals hold a true
`__tracebackhide__`. The recorder's own frames set it; two kinds of frame exist only because the
recorder is there and cannot set it themselves, so an error marks them on its way out:
- torch's dispatch to a function mode (`handle_torch_function`), and the first entry of the
  Python torch function that called it (PyTorch enters that function a second time, from the
  mode, and that entry is the one untracked code shows);
- the recorder's frames at the end of a traceback (the unpack hook raising PyTorch's "modified by
  an inplace operation" inside the engine), which IPython would show as the last frame.

Every other route (`traceback.format_exc()`, `logging.exception`, an uncaught error in a script)
prints every frame, so an error leaving a block loses them for good (`strip_recorder_frames`):
the recorder's frames, torch's dispatch to the mode with the first entry of the function it
re-enters, and the longer branch of `Module._call_impl` that the recorder's global module hooks
make torch take (shown as the direct call to `forward` that untracked code makes).
"""

from __future__ import annotations

import dis
from types import CodeType, FrameType, TracebackType
from typing import Any

from autograd_magic.recorder import module_calls, torch_api
from autograd_magic.recorder.frames import DISPATCH_TO_MODES, is_recorder


def hide_dispatch(caller: FrameType | None) -> None:
    """Mark `caller` (the frame that called the mode) hidden when it is torch's dispatch to modes,
    with the Python torch function frame above it. Runs only on the way out of an error."""
    if caller is None or caller.f_code is not DISPATCH_TO_MODES:
        return
    # An optimized frame's f_locals dict keeps keys that are not local names: the mark stays.
    caller.f_locals["__tracebackhide__"] = True
    entered = caller.f_back
    if entered is not None:
        entered.f_locals["__tracebackhide__"] = True


def drop_recorder_tail(error: BaseException) -> None:
    """Cut the recorder's frames off the end of `error`'s traceback: the error then ends where it
    ends untracked (in the engine's frame, for an unpack hook's error)."""
    last_other = None
    tb = error.__traceback__
    while tb is not None:
        if not is_recorder(tb.tb_frame):
            last_other = tb
        tb = tb.tb_next
    if last_other is not None:
        last_other.tb_next = None


def strip_recorder_frames(error: BaseException) -> None:
    """Take out of `error`'s traceback, in place, every entry that exists only because a block
    recorded (its first entry stays: the frame that caught it, or the block's own)."""
    head = error.__traceback__
    if head is None:
        return
    entries = []
    tb: TracebackType | None = head
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    kept = [head] + [tb for i, tb in enumerate(entries) if i and not _ours(entries, i)]
    kept = _direct_module_calls(kept)
    for before, after in zip(kept, [*kept[1:], None], strict=True):
        before.tb_next = after


def _ours(entries: list[TracebackType], index: int) -> bool:
    """The recorder's frames, torch's dispatch to the recorder's mode, and the first entry of the
    Python torch function that dispatched (the mode enters it again)."""
    frame = entries[index].tb_frame
    if is_recorder(frame):
        return True
    following = entries[index + 1 : index + 3]
    if frame.f_code is DISPATCH_TO_MODES:
        return bool(following) and is_recorder(following[0].tb_frame)
    return (
        len(following) == 2
        and following[0].tb_frame.f_code is DISPATCH_TO_MODES
        and following[0].tb_frame.f_back is frame
        and is_recorder(following[1].tb_frame)
    )


_CALL_IMPL: CodeType = torch_api.MODULE_CALL_IMPL_CODE
_INNER = next(
    (c for c in _CALL_IMPL.co_consts if isinstance(c, CodeType) and c.co_name == "inner"), None
)


def _direct_call() -> tuple[int, int] | None:
    """(offset, line) of `_call_impl`'s `return forward_call(*args, **kwargs)`, the call it makes
    when no hook is set (its first call with `*args`)."""
    starts = [(offset, line) for offset, line in dis.findlinestarts(_CALL_IMPL) if line]
    for instruction in dis.get_instructions(_CALL_IMPL):
        if instruction.opname == "CALL_FUNCTION_EX":
            lines = [line for offset, line in starts if offset <= instruction.offset]
            return (instruction.offset, lines[-1]) if lines else None
    return None


_DIRECT_CALL = _direct_call()


def _direct_module_calls(kept: list[TracebackType]) -> list[TracebackType]:
    """Each `_call_impl` entry followed by its `inner` entry, taken only because the recorder's
    global module hooks were set, becomes the direct call untracked code makes (where torch has
    no `inner`, as 2.4, the hooked branch's call in `_call_impl` itself does)."""
    if _DIRECT_CALL is None:
        return kept
    if _INNER is None:
        return [_as_direct_call(tb) if _hooked_branch(tb) else tb for tb in kept]
    result: list[TracebackType] = []
    skip = False
    for index, tb in enumerate(kept):
        if skip:
            skip = False
            continue
        following = kept[index + 1] if index + 1 < len(kept) else None
        if (
            index
            and following is not None
            and tb.tb_frame.f_code is _CALL_IMPL
            and following.tb_frame.f_code is _INNER
            and not _hooked(tb.tb_frame.f_locals.get("self"))
        ):
            offset, line = _DIRECT_CALL
            tb = TracebackType(None, tb.tb_frame, offset, line)
            skip = True
        result.append(tb)
    return result


def _hooked_branch(tb: TracebackType) -> bool:
    """A `_call_impl` entry on its longer branch only because the recorder's hooks were set."""
    return (
        tb.tb_frame.f_code is _CALL_IMPL
        and _DIRECT_CALL is not None
        and tb.tb_lineno != _DIRECT_CALL[1]
        and tb.tb_next is not None
        and not _hooked(tb.tb_frame.f_locals.get("self"))
    )


def _as_direct_call(tb: TracebackType) -> TracebackType:
    assert _DIRECT_CALL is not None
    offset, line = _DIRECT_CALL
    return TracebackType(None, tb.tb_frame, offset, line)


def _hooked(module: Any) -> bool:
    """Whether `module`'s call takes `_call_impl`'s longer branch untracked as well: a hook of
    its own, or a global module hook that is not the recorder's."""
    if module is None:
        return True
    return torch_api.has_own_hooks(module) or module_calls._has_any_global_hook_but_ours()
