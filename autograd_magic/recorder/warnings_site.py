"""Where torch points at the user's code while a block runs: warnings, anomaly-mode stacks.

`warnings.warn`: a warning lands on the frame it would land on untracked.

A torch function implemented in Python (`F.softmax`) reaches the recorder's mode through
`handle_torch_function` and runs again from the recorder's frames, so a `stacklevel` counted
from inside it would name a recorder line (and key warning filters and once-per-location
deduplication on it). The replacement counts `stacklevel` over the frames untracked code has:
without the recorder's own frames, nor `handle_torch_function` and the outer call above them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from types import FrameType
from typing import Any

import torch
import torch.fx.traceback as torch_fx_traceback

from autograd_magic.recorder.caller import STAND_IN_NAME
from autograd_magic.recorder.frames import PACKAGE_DIR, is_recorder

_OVERRIDES = os.path.join("torch", "overrides.py")
ORIGINAL_WARN = warnings.warn
_is_compiling = torch.compiler.is_compiling


def _untracked_level(stacklevel: int) -> int:
    """The stacklevel, counted from `warn`'s caller, that names the frame untracked code names."""
    frame: FrameType | None = sys._getframe(2)  # warn's caller
    real, virtual = 1, 1
    while frame is not None and virtual < stacklevel:
        frame = frame.f_back
        real += 1
        if frame is None or not is_recorder(frame):
            virtual += 1
            continue
        # A run of recorder frames: skip it, and the dispatch frames torch put above it.
        while frame is not None and is_recorder(frame):
            frame, real = frame.f_back, real + 1
        if frame is not None and frame.f_code.co_filename.endswith(_OVERRIDES):
            frame, real = frame.f_back, real + 1  # handle_torch_function
            if frame is not None:
                frame, real = frame.f_back, real + 1  # the torch function's outer call
        virtual += 1
    return real


def warn(message: Any, category: Any = None, stacklevel: int = 1, source: Any = None) -> None:
    """`warnings.warn`, attributed as untracked (see the module docstring)."""
    if _is_compiling():
        # Traced by torch.compile (it must see the original, see `dynamo`), or called by the
        # compiler itself, with no recorder frame between: only this frame to skip.
        level = stacklevel + 1 if type(stacklevel) is int else stacklevel
        return ORIGINAL_WARN(message, category, level, source)
    if type(stacklevel) is int and stacklevel > 1:
        # Never let attribution change whether a warning is raised.
        with contextlib.suppress(Exception):
            stacklevel = _untracked_level(stacklevel)
    elif type(stacklevel) is int:
        stacklevel = 1  # 0 and below name warn's caller, as the builtin does
    ORIGINAL_WARN(message, category, stacklevel + 1, source)


def without_recorder(entries: list[str]) -> list[str]:
    """A formatted stack (outermost first) as untracked code has it: no recorder entries, nor the
    `handle_torch_function` entry and the outer call that led into them."""
    out: list[str] = []
    marker = f'File "{PACKAGE_DIR}'
    in_run = False
    for entry in entries:
        if marker not in entry and f", in {STAND_IN_NAME}\n" not in entry:
            out.append(entry)
            in_run = False
            continue
        if not in_run and out and _OVERRIDES in out[-1] and "handle_torch_function" in out[-1]:
            del out[-2:]  # handle_torch_function, and the outer call that runs again inside
        in_run = True
    return out


def format_stack() -> list[str]:
    """`torch.fx.traceback.format_stack` (what anomaly mode stores per node), without the
    recorder's frames."""
    return without_recorder(ORIGINAL_FORMAT_STACK())


ORIGINAL_FORMAT_STACK = torch_fx_traceback.format_stack
