"""What autograd_magic installs while a block runs, read from torch itself (tests compare it
before and after)."""

from __future__ import annotations

import bdb
import sys
import warnings

import torch
from torch.nn.modules import module as nn_module
from torch.overrides import _get_current_function_mode_stack


def installed() -> tuple:
    """Function modes, the innermost saved-tensor hooks, global module hooks, the patched
    entry points, the unraisable hook and import hooks."""
    return (
        len(_get_current_function_mode_stack()),
        torch._C._autograd._top_saved_tensors_default_hooks(False),
        torch.from_numpy,
        torch.overrides.has_torch_function,
        bdb.Bdb.stop_here,
        torch.autograd.graph.saved_tensors_hooks.__enter__,
        torch._C._autograd._saved_tensors_hooks_disable,
        torch._C._autograd._saved_tensors_hooks_enable,
        warnings.warn,
        tuple(nn_module._global_forward_pre_hooks),
        tuple(nn_module._global_forward_hooks),
        nn_module._has_any_global_hook,
        sys.unraisablehook,
        tuple(sys.meta_path),  # the watcher for Dynamo's import (recorder.dynamo)
    )
