"""What autograd_magic installs while a block runs, read from torch itself (tests compare it
before and after)."""

from __future__ import annotations

import bdb
import sys
import warnings

import torch
from torch.nn.modules import module as nn_module
from torch.overrides import _get_current_function_mode_stack

from autograd_magic.recorder import torch_api


def saved_hooks_top() -> object:
    """The innermost saved-tensor hooks, or, on a torch that cannot show them (2.4), whether any
    are set: with hooks set, PyTorch unpacks a new tensor object for a saved input."""
    if torch_api.HAS_TOP_SAVED_HOOKS:
        return torch_api.top_saved_hooks(False)
    x = torch.ones(1, requires_grad=True)
    with torch.enable_grad(), torch_api.DisableTorchFunction():
        saved = x.sin().grad_fn._saved_self  # type: ignore[union-attr]
    return None if saved is x else "hooks set"


def no_saved_hooks() -> bool:
    """True when this thread has no saved-tensor hooks set."""
    return saved_hooks_top() is None


def installed() -> tuple:
    """Function modes, the innermost saved-tensor hooks, global module hooks, the patched
    entry points, the unraisable hook and import hooks."""
    return (
        len(_get_current_function_mode_stack()),
        saved_hooks_top(),
        torch.from_numpy,
        torch.overrides.has_torch_function,
        bdb.Bdb.stop_here,
        torch.autograd.graph.saved_tensors_hooks.__enter__,
        torch._C._autograd._saved_tensors_hooks_disable,
        torch._C._autograd._saved_tensors_hooks_enable,
        warnings.warn,
        tuple(nn_module._global_forward_pre_hooks),
        tuple(nn_module._global_forward_hooks),
        getattr(nn_module, "_has_any_global_hook", None),  # torch >= 2.5
        sys.unraisablehook,
        # Watch mode's counted steps wrap these two (recorder.counted_calls).
        torch.autograd.backward,
        torch.autograd.grad,
        # The watcher for Dynamo's import (recorder.dynamo); finders other libraries add when
        # first imported (setuptools' VendorImporter, under older setuptools) are not ours.
        tuple(f for f in sys.meta_path if type(f).__module__.startswith("autograd_magic")),
    )
