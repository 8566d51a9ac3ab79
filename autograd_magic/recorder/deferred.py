"""Interrupts that land where they cannot propagate, held until they can be raised.

Our finalizers (`__del__` of saved buffers and node tags, weak-reference callbacks) run inside
autograd whenever PyTorch frees something; CPython ignores what they raise ("Exception ignored
in ..."). A KeyboardInterrupt (Jupyter's Stop) delivered there would be lost and the user's
loop would run on. So each of them is marked `@finalizer`: a BaseException that is not an
Exception raised in one, whether caught by its own guard (`hold`) or by the unraisable hook
while the block runs (`took`, for one delivered on the finalizer's first instruction, before
any guard of ours can run), is held here. It is raised exactly once: at our next entry point
on that thread (`raise_pending`: the function mode, the pack hook, module hooks, the block's
exit), or, for the main thread, re-delivered a few ms later if nothing of ours ran by then (a
pure-Python tail): at the main thread's next line through `sys.monitoring` on Python 3.12+,
else by `_thread.interrupt_main()`.
"""

from __future__ import annotations

import _thread
import dis
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType
from typing import Any, TypeVar

from autograd_magic.recorder.frames import PACKAGE_DIR

F = TypeVar("F", bound=Callable[..., Any])

# thread ident -> the interrupt held for it; one per thread (a second Stop while one is held
# is the same request). Entry points test its truthiness first: one cheap check per torch call.
pending: dict[int, BaseException] = {}

REDELIVER_AFTER_S = 0.005
# Code of each finalizer -> offset of its first own instruction (an interrupt raised before it
# means the body never ran, so the bookkeeping can be done again).
_FINALIZERS: dict[CodeType, int] = {}
_get_ident = threading.get_ident
_MAIN = threading.main_thread().ident


# Before Python 3.11 a function's first instruction is where an interrupt already pending as it
# starts is raised (so `took` sees that the body never ran), unless it is one of these, before
# which CPython 3.10 does not check for signals: then the interrupt is raised at the body's first
# call or jump, inside the finalizer's guard, after part of the body ran and the rest never runs
# (a saved buffer never marked freed). 3.11+ begins every function with RESUME, which checks.
_NO_SIGNAL_CHECK = (
    frozenset()
    if sys.version_info >= (3, 11)
    else frozenset({"SETUP_FINALLY", "SETUP_WITH", "BEFORE_ASYNC_WITH", "YIELD_FROM"})
)


def finalizer(function: F) -> F:
    """Mark `function` as one of our finalizers or weakref callbacks (it must guard its body
    with `except BaseException as error: hold(error)` after its `except Exception`, and not
    begin with that `try`: its first statement is one that cannot fail, before the guard)."""
    code = function.__code__
    if code not in _FINALIZERS:  # a closure's code is shared by every closure made from it
        first = next(dis.get_instructions(code)).opname
        if first in _NO_SIGNAL_CHECK:
            raise TypeError(f"finalizer {code.co_name} begins with {first} (see _NO_SIGNAL_CHECK)")
        _FINALIZERS[code] = _first_own_offset(code)
    return function


def hold(error: BaseException) -> None:
    """Keep `error` (raised where it cannot propagate) for this thread's next entry point."""
    if isinstance(error, Exception):
        return  # ordinary errors in bookkeeping are dropped, as before
    # Without its traceback: that ends in the finalizer's frame, whose locals (a saved buffer)
    # must die now, and it is raised from where it is raised.
    error = error.with_traceback(None)
    thread = _get_ident()
    if pending.setdefault(thread, error) is error and thread == _MAIN:
        # A bare thread: threading.Timer.start() waits for the thread to start, and a wait
        # longer than the delay would let the re-delivered interrupt land in here.
        _thread.start_new_thread(_redeliver, ())


def take() -> BaseException | None:
    """The interrupt held for this thread, consumed (atomically: only one taker gets it)."""
    return pending.pop(_get_ident(), None)


def raise_pending() -> None:
    """Raise the interrupt held for this thread, if any (callers test `pending` first)."""
    __tracebackhide__ = True
    error = pending.pop(_get_ident(), None)
    if error is not None:
        raise error


def took(unraisable: Any) -> bool:
    """`sys.unraisablehook` filter: True when the unraisable error is an interrupt raised in one
    of our finalizers, now held (its finalizer run again if it had not begun)."""
    error = unraisable.exc_value
    if error is None or isinstance(error, Exception):
        return False
    code = getattr(unraisable.object, "__code__", None)
    first = _FINALIZERS.get(code) if code is not None else None
    if first is None:
        return False
    tb = unraisable.exc_traceback
    if tb is not None and tb.tb_frame.f_code is code and tb.tb_lasti < first:
        # Delivered on entry (CPython checks for signals when a function starts): the body never
        # ran, so the buffer or node would stay alive in the trace. Run it now.
        frame = tb.tb_frame
        args = [frame.f_locals[name] for name in code.co_varnames[: code.co_argcount]]
        del frame, tb
        try:
            unraisable.object(*args)
        except BaseException as again:
            hold(again)
    hold(error)
    return True


def _redeliver() -> None:
    time.sleep(REDELIVER_AFTER_S)
    # Still held: the main thread made no call of ours since (a pure-Python tail).
    if _MAIN is None or _MAIN not in pending:
        return
    if _monitoring is not None and _trap_next_line():
        return
    error = pending.pop(_MAIN, None)
    if error is None:
        return
    if isinstance(error, KeyboardInterrupt):
        _thread.interrupt_main()  # runs the SIGINT handler again, as the Stop did
    else:
        pending.setdefault(_MAIN, error)  # no way to inject it: our next entry point raises it


# Python 3.12+: the held interrupt is raised by a `sys.monitoring` LINE event on the main thread,
# at the start of its next line. A signal (`interrupt_main`) is handled at the interpreter's next
# check, which may be a loop's backward jump: on 3.13 an exception raised there is outside the
# enclosing `with` and `try` (their exception table ranges end before the jump), so it left
# `with track()` without `__exit__` (issue 32). A line start is inside them.
_monitoring = getattr(sys, "monitoring", None)
_TOOL_IDS = (3, 4)  # the ids PEP 669 leaves unassigned (0 debugger, 1 coverage, 2 profiler)
_trap_tool: list[int] = []


def _trap_next_line() -> bool:
    """Have the main thread's next line raise the held interrupt; False when no tool id is free."""
    assert _monitoring is not None
    for tool in _TOOL_IDS:
        try:
            _monitoring.use_tool_id(tool, "autograd_magic interrupt")
        except ValueError:
            continue  # taken by another tool
        _trap_tool[:] = [tool]
        _monitoring.register_callback(tool, _monitoring.events.LINE, _on_line)
        _monitoring.set_events(tool, _monitoring.events.LINE)
        return True
    return False


def _on_line(code: CodeType, line: int) -> Any:
    if _get_ident() != _MAIN or code.co_filename.startswith(PACKAGE_DIR):
        # Another thread, or the recorder's own code: its entry points and the block's exit
        # raise the held interrupt where the recorder can end cleanly, a finalizer would drop it.
        return None
    tool = _trap_tool.pop() if _trap_tool else None
    if tool is not None:
        assert _monitoring is not None
        _monitoring.set_events(tool, 0)
        _monitoring.register_callback(tool, _monitoring.events.LINE, None)
        _monitoring.free_tool_id(tool)
    error = pending.pop(_MAIN, None)
    if error is not None:
        raise error
    return None


def _first_own_offset(code: CodeType) -> int:
    """Offset of the first instruction after the function's prologue (free variables, RESUME)."""
    for instruction in dis.get_instructions(code):
        if instruction.opname not in ("COPY_FREE_VARS", "MAKE_CELL", "RESUME", "NOP"):
            return instruction.offset
    return 0
