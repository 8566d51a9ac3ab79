"""The function mode of a block: each torch call, handed to the recorder by the cheapest path.

It runs once per torch call, so it is kept short: compiled code gets a plain call (Dynamo traces
this method), an interrupt held by a finalizer is raised here first (`deferred`), grad-off
builtins skip the bookkeeping, the common op takes the shortened `calls.OpRecording.plain`
body, and every recorded call runs its body inside the one frame written here.
"""

from __future__ import annotations

import sys
from types import FunctionType
from typing import Any

import torch

from autograd_magic.recorder import install, stacks
from autograd_magic.recorder.deferred import pending, raise_pending
from autograd_magic.recorder.ops import OpKind, classify
from autograd_magic.recorder.tracebacks import hide_dispatch, strip_recorder_frames

# What each torch function does depends only on the function: classified once per process.
KINDS: dict[Any, tuple[OpKind, str]] = {}
PLAIN: set[Any] = set()  # functions of kind PLAIN: the per-op fast path
INPLACE: set[Any] = set()  # functions of kind INPLACE: the write fast path (optimizer steps)
_is_compiling = torch.compiler.is_compiling
_Tensor = torch.Tensor
_PyFunction = FunctionType
_frame = sys._getframe
_grad_enabled = torch.is_grad_enabled
_gettrace = sys.gettrace
_getprofile = sys.getprofile
# Python 3.12+: profilers and debuggers may use `sys.monitoring` instead (cProfile does), and
# then `sys.getprofile()` is None; they hold the tool ids PEP 669 reserves for them.
_monitoring = getattr(sys, "monitoring", None)
_get_tool = _monitoring.get_tool if _monitoring is not None else None
_DEBUGGER_ID = _monitoring.DEBUGGER_ID if _monitoring is not None else 0
_PROFILER_ID = _monitoring.PROFILER_ID if _monitoring is not None else 2


def kind_of(func: Any) -> tuple[OpKind, str]:
    """What `func` does, classified the first time it is seen (whichever path sees it): its
    kind and name, and PLAIN or INPLACE learn it for the mode's fast paths."""
    entry = KINDS.get(func)
    if entry is None:
        entry = KINDS[func] = classify(func)
        if entry[0] is OpKind.PLAIN:
            PLAIN.add(func)
        elif entry[0] is OpKind.INPLACE:
            INPLACE.add(func)
    return entry


def plain_call(func: Any, args: tuple, kwargs: dict | None = None) -> Any:
    """A plain call, for functions that raise their warnings from their own frame."""
    __tracebackhide__ = True
    return func(*args, **kwargs) if kwargs else func(*args)


install.PASS_THROUGH.add(plain_call.__code__)


class RecorderMode(install.BlockMode):
    """The block's function mode: sees every torch call and hands it to its recorder."""

    def __init__(self, recorder: Any) -> None:
        super().__init__()
        # The block's `calls.OpRecording` (typed Any: that module imports this one). None once
        # its block has ended: a mode torch puts back later only passes calls on.
        self.recorder: Any = recorder
        # Its bodies as plain functions, called with it: no bound method made per call.
        parts = type(recorder)
        self._plain, self._inplace = parts.plain, parts.inplace
        self._library = parts.library
        self._general, self._subclass = parts.general, parts.subclass

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _is_compiling():
            # torch.compile traces this method into its graph: give it a plain call (our
            # bookkeeping is not traceable; tracing it breaks the graph and emits warnings).
            return func(*args, **(kwargs or {}))
        __tracebackhide__ = True  # IPython leaves the recorder out of the user's traceback
        try:
            if pending:  # an interrupt caught in one of our finalizers: raise it before this call
                raise_pending()
            recorder = self.recorder
            if recorder is None:
                # Put back on the stack after its block ended (see stacks.purge_ended_modes), or
                # left by a block that ended on another thread: its hooks go now.
                stacks.remove_stranded_hooks()
                return func(*args, **(kwargs or {}))
            # A builtin runs from a stand-in for the caller's frame (C++ warnings land there);
            # a Python function has its own frame for that. Not under a debugger or tracer (the
            # stand-in's line would hit the user's breakpoints a second time), nor a profiler (it
            # would list the stand-in as a function of the user's file), whether they use
            # sys.settrace/setprofile or, on Python 3.12+, sys.monitoring.
            builtin = type(func) is not _PyFunction
            if (
                builtin
                and _gettrace() is None
                and _getprofile() is None
                and (
                    _get_tool is None
                    or (_get_tool(_DEBUGGER_ID) is None and _get_tool(_PROFILER_ID) is None)
                )
            ):
                call = recorder.stand_ins.for_frame(_frame(1))
            else:
                call = plain_call
            no_out = not (kwargs and "out" in kwargs)
            if types and not _plain_types(types):
                # The subclass sees a plain op itself; writes and backward interleave their
                # bookkeeping with the call: recorded as usual (the subclass may see our reads).
                plain = (KINDS.get(func) or kind_of(func))[0] is OpKind.PLAIN and no_out
                body = self._subclass if plain else self._general
                kwargs = kwargs or {}
            elif func in PLAIN and no_out:
                if builtin and not _grad_enabled():
                    # Grad off (an optimizer step, evaluation): a builtin makes no node, saves
                    # nothing and writes nothing, so there is nothing to record.
                    out = call(func, args, kwargs)
                    if recorder.listening.listener is not None:
                        recorder.notify_listener()
                    return out
                # The common op, kept short; a Python function (`F.embedding`) may also write
                # to its inputs inside its body, where this mode does not see the write.
                body = self._plain if builtin else self._library
            elif func in INPLACE and no_out:
                body = self._inplace  # a write on plain tensors (an optimizer's)
                kwargs = kwargs or {}
            else:
                if func not in KINDS:
                    kind_of(func)
                body = self._general
                kwargs = kwargs or {}
            state = recorder.state
            if state.busy:  # the recorder's own torch calls (a probe, the live view's reads)
                return func(*args, **(kwargs or {}))
            # The frame every recorded call runs in: what was unowned before it, and the in-call
            # mark that lets its saved buffers and its node share one stack walk.
            mark = len(state.unowned)
            state.in_call = True
            try:
                out = body(recorder, func, args, kwargs, call, mark)
            finally:
                state.in_call = False
                state.call_site = None
            if recorder.listening.listener is not None:
                recorder.notify_listener()
            return out
        except BaseException as error:
            # torch's dispatch to this mode exists only because the mode does (see tracebacks).
            hide_dispatch(_frame(1))
            strip_recorder_frames(
                error
            )  # what ran below this frame: the block's exit does the rest
            raise


def _plain_types(types: tuple) -> bool:
    """True when no argument type overrides `__torch_function__` (plain tensors, Parameters)."""
    # A set lookup for the common tuples (`all` over a generator costs ~0.2 us a torch call).
    return types in _PLAIN_TUPLES or all(t is _Tensor or t is torch.nn.Parameter for t in types)


_PLAIN_TUPLES = frozenset(
    {
        (_Tensor,),
        (torch.nn.Parameter,),
        (_Tensor, torch.nn.Parameter),
        (torch.nn.Parameter, _Tensor),
    }
)
