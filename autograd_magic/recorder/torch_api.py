"""Every private or release-dependent PyTorch API the package touches, each with its fallback.

The supported range is torch 2.4 to 2.15. What differs inside it is detected once, here, when
the package is imported (by looking, never by comparing version numbers), and every other module
reaches torch's private names only through this one: `tests/test_torch_api.py` fails when a
private torch name (`torch._C...`, `torch._dynamo`, a `_`-prefixed attribute that torch defines on
tensors, nodes, saved tensors or modules) appears anywhere else in the package.

Each entry says what it is for and what the recorder does where the release lacks it:
- a narrower record (a holder not seen, a buffer not assigned to its node), said in README's
  Limits, or
- nothing at all where torch has nothing to patch (torch 2.4 has no `_has_any_global_hook`).
Nothing here may raise in the middle of the user's code.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.modules.module as _nn_module
from torch.overrides import _get_current_function_mode_stack, _pop_mode, _push_mode
from torch.utils._device import DeviceContext as DeviceContext
from torch.utils._python_dispatch import _disable_current_modes

UNKNOWN: Any = object()  # what a probe returns where this release cannot tell

# --- Function modes (torch.overrides' stack helpers; all releases in the range) ---
function_mode_stack: Callable[[], list[Any]] = _get_current_function_mode_stack
pop_function_mode: Callable[[], Any] = _pop_mode
push_function_mode: Callable[[Any], None] = _push_mode
disable_current_modes = _disable_current_modes
# Reading the user's tensors must reach no user mode (or subclass `__torch_function__`).
DisableTorchFunction = torch._C.DisableTorchFunction
DisableTorchFunctionSubclass = torch._C.DisableTorchFunctionSubclass
torch_dispatch_depth: Callable[[], int] = torch._C._len_torch_dispatch_stack
# `torch.set_default_device`'s mode. Newer releases keep it at the bottom of the stack themselves
# (and require it there); torch 2.4 pushes and pops it like any mode, so there it must stay on
# top of the recorder's mode, or changing the default device in a block pops ours instead.
# (Told by what its `__enter__` does: it reorders the stack where it keeps itself at the bottom.)
DEVICE_CONTEXT_AT_BOTTOM = "_len_torch_function_stack" in DeviceContext.__enter__.__code__.co_names

# --- Tensors: version counter, views, reference counts ---
# The version counter autograd compares saved tensors against (`Tensor._version`).
version_of: Callable[[torch.Tensor], int] = operator.attrgetter("_version")
base_of: Callable[[torch.Tensor], torch.Tensor | None] = operator.attrgetter("_base")


def is_view(tensor: torch.Tensor) -> bool:
    """`tensor._is_view()`: True when `tensor` is a view of another tensor's memory."""
    return bool(tensor._is_view())


# A TensorImpl's C++ reference count (`Tensor._use_count`, newer releases). Without it, only
# Python holders of a saved tensor are seen: a holder outside Python counts as none (README,
# Limits).
_use_count: Callable[[torch.Tensor], int] | None = getattr(torch.Tensor, "_use_count", None)


def tensor_use_count(tensor: torch.Tensor) -> int | None:
    """C++ references to `tensor`'s TensorImpl, or None where this torch cannot tell."""
    return None if _use_count is None else _use_count(tensor)


# A storage's reference count. Older CPU-only builds register it with CUDA's module only;
# without it, other tensors sharing a saved storage are not seen.
_storage_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)


def storage_use_count(storage: Any) -> int | None:
    """References to an `untyped_storage()`'s StorageImpl, or None where this torch cannot tell."""
    return None if _storage_use_count is None else _storage_use_count(storage._cdata)


def _cpp_holders_reference_the_python_object() -> bool:
    """Whether a C++ reference to a TensorImpl that has a Python object also holds a reference
    to that object (newer releases), or the object is kept alive otherwise (2.8 and before)."""
    try:
        tensor = torch.empty(0)
        before = sys.getrefcount(tensor)
        held = torch._C.ScriptList([tensor])
        return sys.getrefcount(tensor) > before and len(held) == 1
    except Exception:
        return True


CPP_HOLDERS_REFERENCE_THE_PYTHON_OBJECT = _cpp_holders_reference_the_python_object()


# --- Autograd nodes ---
# Node attributes reading saved values: `_saved_<name>` unpacks, `_raw_saved_<name>` is the
# SavedTensor (or a list of them) behind it.
SAVED_ATTR_PREFIX = "_saved_"


def node_sequence_nr(node: Any) -> int:
    """The autograd sequence number `node` was made with (per thread, increasing)."""
    return int(node._sequence_nr())


# PyTorch's own read of the thread's counter (`at::sequence_number::peek`); None where it is
# missing (the recorder then makes a probe node to learn it).
current_sequence_nr_peek: Callable[[], int] | None = getattr(
    torch._C._autograd, "_get_sequence_nr", None
)


def raw_saved(node: Any, name: str) -> Any:
    """The SavedTensor(s) behind `node.<name>` (`_raw_saved_x` for `_saved_x`; the Function's
    `_raw_saved_tensors` for `saved_tensors`). Raises AttributeError where there is none: the
    attribute holds an int, sizes or a scalar."""
    return getattr(node, "_raw" + name if name.startswith("_") else "_raw_" + name)


def forward_class(node: Any) -> Any:
    """The `torch.autograd.Function` a custom Function's backward node belongs to, or None."""
    return getattr(node, "_forward_cls", None)


# `SavedTensor.unpack_hook` (torch >= 2.9): which unpack hook a saved slot will run. Where it is
# missing, the slot's hooks are the ones innermost on the thread's stack when the node was made
# (`top_saved_hooks`), which is when the recorder reads it.
HAS_SAVED_UNPACK_HOOK = hasattr(torch._C._autograd.SavedTensor, "unpack_hook")


def saved_unpack_hook(saved: Any) -> Any:
    """The unpack hook `saved` (a SavedTensor) runs, None for none, or, where this torch does
    not say, the innermost unpack hook on the thread's stack now (UNKNOWN where that cannot be
    read either: torch 2.4)."""
    if HAS_SAVED_UNPACK_HOOK:
        return saved.unpack_hook
    top = top_saved_hooks()
    return top if top is UNKNOWN or top is None else top[1]


# --- The autograd profiler (record_function on or off; all releases in the range) ---
profiler_enabled: Callable[[], bool] = torch._C._autograd._profiler_enabled
enable_record_function: Callable[[bool], None] = torch._C._autograd._enable_record_function


# --- A list that holds tensors as C++ does (TorchScript's typed List[Tensor]) ---
def new_tensor_list(items: list[torch.Tensor]) -> Any:
    """A `List[Tensor]` made in C++ (`torch._C.ScriptList`): each item is held by its
    TensorImpl, not its Python object, as autograd's saved slots hold them. None where this
    torch has no such list (then `saved.TensorSlots` keeps Python objects)."""
    try:
        return torch._C.ScriptList(items)
    except Exception:
        return None


# --- Saved-tensor default hooks (the stack `saved_tensors_hooks` pushes onto) ---
AUTOGRAD_C: Any = torch._C._autograd  # owner of the entries `install` patches
SAVED_HOOKS_DISABLE = "_saved_tensors_hooks_disable"
SAVED_HOOKS_ENABLE = "_saved_tensors_hooks_enable"
push_saved_hooks: Callable[[Any, Any], None] = torch._C._autograd._push_saved_tensors_default_hooks
pop_saved_hooks: Callable[[], None] = torch._C._autograd._pop_saved_tensors_default_hooks
hooks_disabled_message: Callable[[], str | None] = (
    torch._C._autograd._saved_tensors_hooks_get_disabled_error_message
)
# Reading the stack's top (torch >= 2.5). Without it the stack cannot be inspected: a block
# takes its hooks off by popping the top, which is right as long as saved-tensor hooks contexts
# opened in the block also closed in it (README, Limits).
_top_saved_hooks: Callable[[bool], Any] | None = getattr(
    torch._C._autograd, "_top_saved_tensors_default_hooks", None
)
HAS_TOP_SAVED_HOOKS = _top_saved_hooks is not None


# Whether the hooks that packed a saved tensor can be told (from the SavedTensor, or from the
# stack's top when its node is made): not on torch 2.4.
TELLS_WHO_PACKED = HAS_SAVED_UNPACK_HOOK or HAS_TOP_SAVED_HOOKS


def top_saved_hooks(ignore_is_tracing: bool = True) -> Any:
    """The innermost (pack, unpack) pair on this thread's stack, None when it is empty, or
    UNKNOWN where this torch cannot tell."""
    return UNKNOWN if _top_saved_hooks is None else _top_saved_hooks(ignore_is_tracing)


# --- nn.Module global hooks ---
NN_MODULE: Any = _nn_module  # owner of the global hook tables below
# Attributes of an nn.Module instance holding its children, parameters and buffers.
MODULE_TABLES = ("_modules", "_parameters", "_buffers")


def global_module_hook_tables() -> tuple[dict[int, Any], ...]:
    """The global (pre-)forward and (pre-)backward hook dicts, as torch reads them."""
    m = _nn_module
    return (
        m._global_backward_pre_hooks,
        m._global_backward_hooks,
        m._global_forward_pre_hooks,
        m._global_forward_hooks,
    )


forward_pre_hooks: dict[int, Any] = _nn_module._global_forward_pre_hooks
forward_hooks: dict[int, Any] = _nn_module._global_forward_hooks
forward_hooks_always_called: dict[int, bool] = _nn_module._global_forward_hooks_always_called


def add_global_forward_hooks(pre_id: int, pre: Any, post_id: int, post: Any) -> None:
    """Register a global forward pre-hook and an always-called forward hook under these ids (as
    `register_module_forward_(pre_)hook` would, with keys that stay the same across blocks)."""
    m = _nn_module
    m._global_forward_pre_hooks[pre_id] = pre
    m._global_forward_hooks[post_id] = post
    m._global_forward_hooks_always_called[post_id] = True


# torch's "is there any global module hook?" (torch >= 2.5; `torch.compile`d modules warn on
# it). Where it is missing there is nothing to hide our hooks from.
original_has_any_global_hook: Callable[[], bool] | None = getattr(
    _nn_module, "_has_any_global_hook", None
)


def set_has_any_global_hook(check: Callable[[], bool] | None) -> None:
    """Put `check` in place of torch's check (None: torch's own); nothing where torch has none."""
    if original_has_any_global_hook is not None:
        _nn_module._has_any_global_hook = check or original_has_any_global_hook


# `nn.Module.__call__`'s body: a module with a hook of its own, or while a global module hook
# is set, takes its longer branch (through `inner()`).
MODULE_CALL_IMPL_CODE = torch.nn.Module._call_impl.__code__


def has_own_hooks(module: Any) -> bool:
    """Whether `module` has a forward or backward (pre-)hook of its own."""
    return bool(
        module._backward_hooks
        or module._backward_pre_hooks
        or module._forward_hooks
        or module._forward_pre_hooks
    )


# --- Dynamo (imported lazily: it takes seconds) ---
DYNAMO_MODULE = "torch._dynamo"


def dynamo_names_resolved() -> bool:
    """True when Dynamo's caches of torch objects found by name are built (its first compile
    builds them; `torch.distributed` clears them), or where this release has no such caches."""
    try:
        from torch._dynamo import trace_rules
        from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

        return all(
            cached.cache_info().currsize > 0
            for cached in (
                trace_rules.get_torch_obj_rule_map,
                TorchInGraphFunctionVariable._get_handlers,
            )
        )
    except Exception:  # another torch version: nothing known to resolve
        return True


def dynamo_resolve_names() -> None:
    """Build Dynamo's caches of torch objects found by name (as its first compile would)."""
    from torch._dynamo import trace_rules
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    trace_rules.get_torch_obj_rule_map()
    TorchInGraphFunctionVariable._get_handlers()


def dynamo_skip_code(code: Any) -> None:
    """Keep Dynamo from compiling `code` as a frame of its own (it stays inlinable)."""
    from torch._dynamo.eval_frame import skip_code

    skip_code(code)
