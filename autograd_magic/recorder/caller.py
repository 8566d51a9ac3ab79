"""Runs a torch builtin from a stand-in for its caller's frame.

PyTorch's C++ code raises its warnings (`PyErr_WarnEx`, stacklevel 1) on the innermost Python
frame. Untracked that is the frame that called the op; tracked it would be the recorder's, so
warning filters by module and once-per-location deduplication would see a recorder line. The
stand-in is a one-line function whose code carries the caller's file and line and which runs
with the caller's globals (module name, `__warningregistry__`): the warning lands where it
lands untracked.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import CodeType, FrameType, FunctionType, ModuleType
from typing import Any

from autograd_magic.recorder import dynamo

STAND_IN_NAME = "autograd_magic_call"  # how walks over the stack recognise a stand-in frame
# One line, so moving `co_firstlineno` moves every instruction onto the caller's line.
# `__tracebackhide__` keeps the stand-in out of IPython tracebacks.
_SOURCE = (
    "def autograd_magic_call(func, args, kwargs=None, __tracebackhide__=True):"
    " return func(*args, **kwargs) if kwargs else func(*args)\n"
)


def _without_columns(code: CodeType) -> CodeType:
    """`code` with every instruction on its first line and no column positions, so a traceback
    through a stand-in shows the caller's line without carets under the wrong columns."""
    if sys.version_info < (3, 11):  # 3.10's line table has no columns to drop
        return code
    table, units = bytearray(), len(code.co_code) // 2
    while units > 0:  # 3.11+ location entries: code 13 (no columns), line delta 0
        span = min(units, 8)
        table += bytes((0x80 | 13 << 3 | (span - 1), 0))
        units -= span
    return code.replace(co_linetable=bytes(table))


_TEMPLATE: CodeType = _without_columns(
    next(
        c for c in compile(_SOURCE, "<autograd_magic>", "exec").co_consts if isinstance(c, CodeType)
    )
)
_MAX_SITES = 65_536
# (file, line) -> template moved there: code objects hold no user data, shared by every block.
_CODES: dict[tuple[str, int], CodeType] = {}

# Stand-ins run torch calls: Dynamo must never compile one (see `dynamo`).
dynamo.also_skip(lambda: [_TEMPLATE, *_CODES.values()])

StandIn = Callable[..., Any]
Position = tuple[int, int]  # (id of the caller's code object, its instruction offset)

# Stand-ins whose globals are a module's (alive as long as the module): shared by every block,
# so a loop of short blocks does not rebuild them. Each keyed code object is kept with its
# stand-in, so its id cannot be reused while cached.
_SHARED: dict[Position, tuple[FunctionType, CodeType]] = {}


class CallerStandIns:
    """Per block: the stand-in for each call position seen. Keeps only globals that outlive
    the block anyway (a module's, shared across blocks, or the namespace the block was given
    until `clear()` at its end)."""

    def __init__(self, namespace: dict[str, Any] | None = None) -> None:
        self._by_position: dict[Position, tuple[FunctionType, CodeType]] = {}
        self._namespace = namespace

    def for_frame(self, frame: FrameType) -> StandIn:
        """The stand-in for `frame`'s current call (its file, line and globals)."""
        position = (id(frame.f_code), frame.f_lasti)
        entry = _SHARED.get(position) or self._by_position.get(position)
        # The same code can run under other globals (exec of one code object twice).
        if entry is None or entry[0].__globals__ is not frame.f_globals:
            return self._make(frame, position)
        return entry[0]

    def _make(self, frame: FrameType, position: Position) -> StandIn:
        code = frame.f_code
        where = (code.co_filename, frame.f_lineno or code.co_firstlineno)
        moved = _CODES.get(where)
        if moved is None:
            if len(_CODES) > _MAX_SITES:
                _CODES.clear()
            moved = _CODES[where] = _TEMPLATE.replace(co_filename=where[0], co_firstlineno=where[1])
            dynamo.skip_if_loaded(moved)
        namespace = frame.f_globals
        stand_in = FunctionType(moved, namespace, None, (None, True))
        if _is_module_namespace(namespace):
            table = _SHARED
        elif namespace is self._namespace:
            table = self._by_position
        else:
            # An exec() namespace the user may drop mid-block (freeing what it holds): never
            # kept, the stand-in is made again for each call from it.
            return stand_in
        if len(table) > _MAX_SITES:
            table.clear()
        table[position] = (stand_in, code)
        return stand_in

    def clear(self) -> None:
        """Drop the block's own stand-ins (the block has ended)."""
        self._by_position.clear()


def _is_module_namespace(namespace: dict[str, Any]) -> bool:
    name = dict.get(namespace, "__name__")  # dict's own get: a subclass's runs no user code
    module = sys.modules.get(name) if isinstance(name, str) else None
    return isinstance(module, ModuleType) and module.__dict__ is namespace
