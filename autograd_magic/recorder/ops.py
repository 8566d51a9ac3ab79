"""What a torch function does to memory, decided once per function: alias, copy, in-place, backward.

Keeps the recorder's per-op path to one dict lookup.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from typing import Any

import torch


class OpKind(enum.Enum):
    PLAIN = "plain"
    INPLACE = "inplace"
    ALIAS = "alias"  # may return a view of its first argument (or a copy, or itself)
    COPY = "copy"  # returns new memory made from its first argument
    DATA = "data"  # `.data`: same storage, separate version counter
    NUMPY = "numpy"  # `Tensor.numpy`: an ndarray on the same memory
    AS_TENSOR = "as_tensor"  # shares memory with its argument when it can
    BACKWARD = "backward"
    GRAD = "grad"


_ALIAS_NAMES = frozenset(
    [
        "detach",
        "__getitem__",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "t",
        "T",
        "mT",
        "H",
        "mH",
        "transpose",
        "swapaxes",
        "swapdims",
        "permute",
        "expand",
        "expand_as",
        "narrow",
        "select",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "tensor_split",
        "hsplit",
        "vsplit",
        "dsplit",
        "diagonal",
        "as_strided",
        "unfold",
        "movedim",
        "moveaxis",
        "real",
        "imag",
        "view_as_real",
        "view_as_complex",
        "contiguous",
        "to",
        "cpu",
        "cuda",
        "type",
        "float",
        "double",
        "half",
        "bfloat16",
        "long",
        "int",
        "bool",
        "alias",
        "ravel",
    ]
)
_COPY_NAMES = frozenset(["clone", "tensor", "new_tensor", "copy"])
_AS_TENSOR_NAMES = frozenset(["as_tensor", "asarray"])
_INPLACE_DUNDERS = frozenset(
    [
        "__iadd__",
        "__isub__",
        "__imul__",
        "__itruediv__",
        "__ifloordiv__",
        "__imod__",
        "__ipow__",
        "__iand__",
        "__ior__",
        "__ixor__",
        "__ilshift__",
        "__irshift__",
        "__imatmul__",
        "__setitem__",
    ]
)
# Ops that only look in-place by name: they never touch a tensor's data.
_NOT_WRITES = frozenset(["requires_grad_", "retain_grad_", "share_memory_", "set_requires_grad_"])


def op_name(func: Callable[..., Any]) -> str:
    """`add_`, `__getitem__`, or the property name for getters like `Tensor.data`."""
    name = getattr(func, "__name__", None) or repr(func)
    if name == "__get__":
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", name)
    return name


def _has_inplace_parameter(func: Callable[..., Any]) -> bool:
    try:
        return "inplace" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def classify(func: Callable[..., Any]) -> tuple[OpKind, str]:
    """The kind and display name of a torch function."""
    name = op_name(func)
    if func is torch.Tensor.backward or func is torch.autograd.backward:
        return OpKind.BACKWARD, "backward"
    if func is torch.autograd.grad:
        return OpKind.GRAD, "autograd.grad"
    if name == "data":
        return OpKind.DATA, name
    if name == "numpy":
        return OpKind.NUMPY, name
    if name in _AS_TENSOR_NAMES:
        return OpKind.AS_TENSOR, name
    if name in _NOT_WRITES:
        return OpKind.PLAIN, name
    if name in _INPLACE_DUNDERS or (name.endswith("_") and not name.endswith("__")):
        return OpKind.INPLACE, name
    if name in _ALIAS_NAMES:
        return OpKind.ALIAS, name
    if name in _COPY_NAMES:
        return OpKind.COPY, name
    if _has_inplace_parameter(func):
        return OpKind.INPLACE, name
    return OpKind.PLAIN, name


# Links through which two tensors share a version counter (detach and views do; .data,
# NumPy and from_numpy do not, which is why writes through them bypass autograd's check).
VERSION_SHARING_HOWS = _ALIAS_NAMES | {"inplace"}
