"""An independent count of retained bytes, for checking `retained_bytes` and its peak.

Its own saved-tensor hooks keep only each saved storage's address and size (and the tensor, as
autograd would); the truth at a moment is the size of every storage some saved slot holds,
minus the storages the running case's own namespace and its model still hold. It is taken
after every save, so its peak is the true peak of what the graphs alone hold.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

_Case = Callable[[], dict[str, Any]]


class _Slot:
    """What the truth's pack hook returns: the saved tensor, and a finalizer per slot."""

    __slots__ = ("count", "key", "tensor")

    def __init__(self, tensor: torch.Tensor, key: int, count: dict[int, int]) -> None:
        self.tensor, self.key, self.count = tensor, key, count

    def __del__(self) -> None:
        self.count[self.key] -= 1


def held_storages(namespace: Any) -> set[int]:
    """Addresses of the storages of every tensor reachable from `namespace` (containers,
    modules' parameters and buffers, views' bases, optimizers' state)."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = [namespace]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.add(obj.untyped_storage().data_ptr())
            if obj._base is not None:
                stack.append(obj._base)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif isinstance(obj, torch.nn.Module):
            stack.extend(obj.parameters())
            stack.extend(obj.buffers())
        elif isinstance(obj, torch.optim.Optimizer):
            stack.extend(obj.state.values())
    return found


def measure(case: _Case) -> tuple[int, int]:
    """(retained bytes at the end, peak) of `case`, counted independently."""
    count: dict[int, int] = {}
    sizes: dict[int, int] = {}
    peak = [0]
    frame_of_case: list[Any] = []

    def retained(namespace: Any) -> int:
        held = held_storages(namespace)
        return sum(sizes[k] for k, n in count.items() if n > 0 and k not in held)

    def pack(tensor: torch.Tensor) -> _Slot:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        sizes[key] = storage.nbytes()
        count[key] = count.get(key, 0) + 1
        slot = _Slot(tensor.detach(), key, count)
        frame = frame_of_case[0] if frame_of_case else None
        if frame is not None:
            peak[0] = max(peak[0], retained(dict(frame.f_locals)))
        return slot

    def unpack(slot: _Slot) -> torch.Tensor:
        return slot.tensor

    def tracer(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is case.__code__:
            frame_of_case.append(frame)
            sys.setprofile(None)

    sys.setprofile(tracer)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            namespace = case()
    finally:
        sys.setprofile(None)
    end = retained(namespace)
    return end, max(peak[0], end)
