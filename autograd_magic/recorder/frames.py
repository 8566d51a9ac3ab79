"""Which frames exist only because a block is recording: the recorder's own (and the stand-ins
it runs builtins from), and torch's dispatch to a function mode. Warnings, debuggers and
tracebacks all leave them out, so they are recognized here alone."""

from __future__ import annotations

import os
import sys
from types import FrameType

import torch

from autograd_magic.recorder.caller import STAND_IN_NAME

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# `handle_torch_function`: torch runs it only when a mode or a tensor subclass is in play.
DISPATCH_TO_MODES = torch.overrides.handle_torch_function.__code__


def outside_caller() -> FrameType:
    """The innermost frame that is not the recorder's: the code that entered or left a block,
    however many of the recorder's own calls lie between."""
    frame = sys._getframe(1)
    while is_recorder(frame) and frame.f_back is not None:
        frame = frame.f_back
    return frame


def is_recorder(frame: FrameType) -> bool:
    """The recorder's own frames, and the stand-ins it runs builtins from (see `caller`)."""
    code = frame.f_code
    return code.co_filename.startswith(PACKAGE_DIR) or code.co_name == STAND_IN_NAME
