"""The floors under the recorder's cost: what any recorder on its mechanism pays (issue 23).

`mechanism()`: an empty function mode and no-op saved-tensor hooks, no bookkeeping at all.
`reads_only()`: the same hooks doing only what an ideal recorder could not skip: tag each new
autograd node (the recorder's own tag, so its death costs what a block's does after it ends) and
read each saved tensor's storage, size, version, shape and dtype (detaching a saved output, as the
recorder must). No records, no source lines, no deaths or writes recorded.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from autograd_magic.recorder.nodes import tag_maker

_KEY = "autograd_magic:floor"


class EmptyMode(TorchFunctionMode):
    """A function mode that only passes each call on: the mechanism's cost, no bookkeeping."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def keep(value: Any) -> Any:
    """A saved-tensor hook that keeps the tensor as is."""
    return value


class _Nobody:
    pass


class _TaggingMode(TorchFunctionMode):
    """Tags the node each call makes, and reads its inputs' nodes, as node discovery must."""

    def __init__(self) -> None:
        super().__init__()
        self._tag = tag_maker()
        # Dead at once: a dying node's tag reports to no one (what a tag does after its block).
        self._nobody: weakref.ref[Any] = weakref.ref(_Nobody())
        self._next_id = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if type(out) is torch.Tensor:
            node: Any = out.grad_fn
            if node is not None:
                metadata = node.metadata
                if _KEY not in metadata:
                    self._next_id += 1
                    metadata[_KEY] = self._tag(self._nobody, self._next_id)
                    for child, _ in node.next_functions:
                        if child is not None:
                            child.metadata.get(_KEY)
        return out


def read_saved(tensor: torch.Tensor) -> torch.Tensor:
    """A pack hook that reads what a saved buffer's record needs, and keeps a saved output
    detached (keeping it whole would make a cycle through its own node)."""
    storage = tensor.untyped_storage()
    storage.data_ptr(), storage.nbytes(), tensor._version, tensor.shape, tensor.dtype
    return tensor if tensor.grad_fn is None else tensor.detach()


def no_op_hooks() -> torch.autograd.graph.saved_tensors_hooks:
    """The mechanism's other half: saved-tensor hooks that keep each tensor as is."""
    return torch.autograd.graph.saved_tensors_hooks(keep, keep)


@contextlib.contextmanager
def mechanism() -> Iterator[None]:
    """The mechanism alone: an empty mode and no-op hooks."""
    with EmptyMode(), no_op_hooks():
        yield


@contextlib.contextmanager
def reads_only() -> Iterator[None]:
    """The mechanism doing only the reads an ideal recorder needs (see the module)."""
    with _TaggingMode(), torch.autograd.graph.saved_tensors_hooks(read_saved, keep):
        yield
