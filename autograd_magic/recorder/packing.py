"""Saved-tensor hooks of a block: each tensor autograd saves becomes a `SavedBuffer` record.

`SavedTensorHooks` is the part of the recorder behind the pack and unpack hooks; the packed
object (`saved.PackedSaved`) and its traps live in `saved`.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from autograd_magic.model.records import SavedBuffer
from autograd_magic.recorder import torch_api
from autograd_magic.recorder.aliases import AliasTracker
from autograd_magic.recorder.deferred import pending, raise_pending
from autograd_magic.recorder.saved import PackedSaved, is_parameter, may_own_saved, storage_of
from autograd_magic.recorder.state import BlockState

_TYPE_NAMES: dict[Any, str] = {}
_SHAPES: dict[tuple[int, ...], tuple[int, ...]] = {}


class SavedTensorHooks:
    """The block's pack and unpack hooks: each saved tensor becomes a record."""

    def __init__(self, state: BlockState, aliases: AliasTracker) -> None:
        self.state = state
        self.aliases = aliases
        self._next_buffer_id = 1

    def pack(self, tensor: torch.Tensor) -> PackedSaved | torch.Tensor:
        if pending:
            raise_pending()
        state = self.state
        if state.pack is None:  # the block has ended; its hooks are stranded (see strand)
            return tensor
        state.busy += 1
        try:
            buffer_id = self._next_buffer_id
            self._next_buffer_id = buffer_id + 1
            grad_fn: Any = tensor.grad_fn  # read once: PackedSaved needs it too
            packed = PackedSaved(
                tensor, grad_fn, state.writer_ref, buffer_id, self._is_old(grad_fn)
            )
            writer = state.writer
            seq = writer.buffer_packed()  # as soon as `packed` exists: its finalizer uncounts it
            packed.storage_key, storage_nbytes = storage_of(tensor)
            site = state.call_site
            if site is None:
                site = state.sites.here()
                # One stack walk per torch call, shared by the buffers it saves and its node.
                if state.in_call:
                    state.call_site = site
            is_leaf = tensor.is_leaf
            dtype, device = tensor.dtype, tensor.device
            buffer = SavedBuffer(
                buffer_id,
                None,
                _interned_shape(tensor),
                _TYPE_NAMES.get(dtype) or _type_name(dtype),
                _TYPE_NAMES.get(device) or _type_name(device),
                packed.nbytes,
                storage_nbytes,
                is_leaf,
                is_leaf and is_parameter(tensor),
                packed.version,
                seq,
                site,
                packed.storage_key,
            )
            self.aliases.watch_saved(packed)
            state.unowned.append(buffer_id)
            writer.buffer_saved(buffer, packed.storage_key, packed.held_by)
            if writer.untrack is not None:
                # Only autograd's C++ slot and our weak references point at it: it can be in no
                # cycle the collector could see, and tracked it would survive into the oldest
                # generation with its graph, making the user's full collections come sooner.
                writer.untrack(packed)
            return packed
        finally:
            state.busy -= 1

    def _is_old(self, grad_fn: Any) -> bool:
        """True when `grad_fn` (the saved tensor's) is surely not the node saving it (then the
        tensor is an input or a leaf, which PyTorch keeps whole): none, already tagged, made
        before the block on this thread (sequence numbers are per thread), or of a type that
        saves no tensor (a view made inside the same op, as `weight.t()` inside `F.linear`)."""
        state = self.state
        return (
            grad_fn is None
            or state.key in grad_fn.metadata
            or (
                threading.get_ident() == state.thread
                and torch_api.node_sequence_nr(grad_fn) < state.sequence_start
            )
            or not may_own_saved(type(grad_fn))
        )

    def unpack(self, packed: PackedSaved | torch.Tensor) -> torch.Tensor:
        if not isinstance(packed, PackedSaved):
            return packed  # packed after the block ended
        state = self.state
        hits = state.probe_hits
        if hits is not None:
            hits.append(packed.buffer_id)
            return packed.tensor
        state.busy += 1
        try:
            return packed.checked_tensor()
        finally:
            state.busy -= 1


def _type_name(value: Any) -> str:
    """'float32', 'cpu', 'cuda:0': one shared string per dtype/device (records stay small)."""
    name = _TYPE_NAMES.get(value)
    if name is None:
        name = _TYPE_NAMES[value] = str(value).replace("torch.", "")
    return name


def _interned_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    try:
        size = tensor.shape
    except RuntimeError:  # a strided nested tensor has no single shape
        return ()
    # A torch.Size hashes and compares as the tuple it holds: look it up before copying it.
    shape = _SHAPES.get(size)
    if shape is None:
        shape = tuple(size)
        if len(_SHAPES) < 65_536:
            _SHAPES[shape] = shape
    return shape
