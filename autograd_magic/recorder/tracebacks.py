"""What an error passing through the recorder shows of it: nothing.

Tools that print tracebacks (IPython, pytest) leave out frames whose locals hold a true
`__tracebackhide__`. The recorder's own frames set it; two kinds of frame exist only because the
recorder is there and cannot set it themselves, so an error marks them on its way out:
- torch's dispatch to a function mode (`handle_torch_function`), and the first entry of the
  Python torch function that called it (PyTorch enters that function a second time, from the
  mode, and that entry is the one untracked code shows);
- the recorder's frames at the end of a traceback (the unpack hook raising PyTorch's "modified by
  an inplace operation" inside the engine), which IPython would show as the last frame.
"""

from __future__ import annotations

from types import FrameType

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
