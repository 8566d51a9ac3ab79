"""Who besides autograd's graphs holds a saved storage, read from reference counts.

A saved storage is the graph's (it counts as retained) when every reference to it comes from
the tensors the graph saved: our packed objects' tensors and the bases their views keep. Any
other reference means the graph's death would not free the memory, and says who holds it:
Python references to a saved tensor (the user's variable, a list, a module's buffer table),
another tensor on the same storage (the output the user kept, the dataset a batch is a view
of), a NumPy array that owns the memory, or a holder outside Python (autocast's cast cache,
a graph recorded by nobody). Read only when a number is shown: a refresh, a backward call,
the block's end.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from autograd_magic.model.records import HeldBy
from autograd_magic.recorder import torch_api
from autograd_magic.recorder.saved import PackedSaved

if TYPE_CHECKING:
    from autograd_magic.recorder.aliases import AliasTracker
    from autograd_magic.recorder.module_calls import ModuleTracker
    from autograd_magic.recorder.state import BlockState

# Holders that outlive any graph: a storage they hold is not asked about again.
_FIXED = frozenset({"parameter", "module buffer"})


class HolderReader:
    """One block's reads of who holds saved memory."""

    def __init__(
        self,
        state: BlockState,
        aliases: AliasTracker,
        modules: ModuleTracker,
        read_graph_holders: Callable[[], None],
    ) -> None:
        self.state = state
        self.aliases = aliases
        self.modules = modules
        self._read_graph_holders = read_graph_holders  # graph_holders.LiveHolders.read

    def read_for_listener(self) -> None:
        """What a live view reads besides the counters: who holds saved memory, and which
        tracked tensors and arrays are alive (storage groups hide dead temporaries)."""
        self.read_holders()
        self.state.writer.end.alive_now(set(self.aliases.registry.alive().values()))
        self._read_graph_holders()

    def read_holders(self) -> None:
        """Ask who holds each storage saved since the last read, and each not counted as
        retained that may have been let go of since (before a number is shown: a refresh, a
        backward call, the block's end)."""
        state = self.state
        writer = state.writer
        # Copied in one C call each: a release on an autograd thread may change them meanwhile.
        known = dict(writer.held_by)
        keys = [k for k in tuple(writer.new_storages) if known.get(k, "") not in _FIXED]
        keys += [k for k, why in known.items() if why not in _FIXED]
        changes: dict[int, tuple[HeldBy, list[int]]] = {}
        if keys:
            holders = Holders(
                lambda: self.modules.root_placeholders().values(), self.aliases.numpy_owner
            )
            state.busy += 1
            try:
                # Reading the user's tensors must reach no user mode or subclass.
                with torch_api.DisableTorchFunction():
                    for key in dict.fromkeys(keys):
                        packed = self.aliases.live_saved_on(key) if key else []
                        if packed:
                            held_by = holder_of(packed, key, holders)
                            if held_by != writer.held_by.get(key, ""):
                                changes[key] = (held_by, [p.buffer_id for p in packed])
                        del packed
            finally:
                state.busy -= 1
        writer.reclassify(changes)


class Holders:
    """What is known at one read: module parameters and buffers (by id), computed on first
    need, and the arrays that own from_numpy memory (storage key -> array, weakly)."""

    def __init__(
        self,
        modules: Callable[[], Iterable[Any]],
        numpy_owner: Callable[[int], Any],
    ) -> None:
        self._modules = modules
        self._numpy_owner = numpy_owner
        self._parameters: set[int] | None = None
        self._buffers: set[int] = set()

    def module_role(self, tensor: torch.Tensor) -> HeldBy | None:
        """'parameter' or 'module buffer' when a module of the block registers `tensor`."""
        if self._parameters is None:
            self._parameters = set()
            for module in self._modules():
                self._parameters.update(id(p) for p in module.parameters())
                self._buffers.update(id(b) for b in module.buffers())
        if id(tensor) in self._parameters:
            return "parameter"
        if id(tensor) in self._buffers:
            return "module buffer"
        return None

    def numpy_holds(self, storage_key: int) -> bool:
        """True when a NumPy array owning this memory is still referenced by someone else."""
        array = self._numpy_owner(storage_key)
        # References: the tensor storage's deleter, `array` here, getrefcount's argument.
        return array is not None and sys.getrefcount(array) > 3


def holder_of(packed: list[PackedSaved], storage_key: int, holders: Holders) -> HeldBy:
    """Why the storage that `packed` (the live saved buffers on one storage) saved is not the
    graph's alone, or "" when it is."""
    held: dict[int, torch.Tensor] = {}  # each TensorImpl we know of, once
    packs: dict[int, int] = {}  # TensorImpl -> packed objects holding its Python object
    slots: dict[int, int] = {}  # TensorImpl -> packed objects holding it in a C++ slot
    views_on: dict[int, int] = {}  # TensorImpl -> views among ours whose base it is
    for pack in packed:
        tensor = pack.tensor
        counts = slots if pack.held_in_slot else packs
        counts[id(tensor)] = counts.get(id(tensor), 0) + 1
        held[id(tensor)] = tensor
    for tensor in list(held.values()):
        if torch_api.is_view(tensor):
            base = torch_api.base_of(tensor)
            assert base is not None  # a view always has one
            views_on[id(base)] = views_on.get(id(base), 0) + 1
            held.setdefault(id(base), base)
            del base
    del tensor
    for key in held:
        ours = (packs.get(key, 0), slots.get(key, 0))
        reason = _held_outside(held, key, ours, views_on.get(key, 0), holders)
        if reason:
            return reason
    # One reference per TensorImpl on the storage, plus the storage object read here. (None
    # where this torch cannot tell: other tensors on the storage are not seen.)
    storage_uses = torch_api.storage_use_count(next(iter(held.values())).untyped_storage())
    if storage_uses is not None and storage_uses - 1 > len(held):
        return "live tensor"
    if holders.numpy_holds(storage_key):
        return "NumPy array"
    return ""


def _held_outside(
    held: dict[int, torch.Tensor],
    key: int,
    ours: tuple[int, int],
    views: int,
    holders: Holders,
) -> HeldBy:
    """Why one TensorImpl has a holder beyond the graph ("" when it has none); `ours` counts
    the packed objects holding it by its Python object and by a C++ slot."""
    tensor = held[key]
    packs, slots = ours
    role = holders.module_role(tensor)
    if role is not None:
        return role
    # (None where this torch cannot tell: only Python holders are seen.)
    uses = torch_api.tensor_use_count(tensor) or 1
    # C++ references: the Python object, each of our slots and views' base links, and the
    # AccumulateGrad node of a leaf that requires grad (part of the graph).
    own_cpp = 1 + slots + views + (1 if tensor.is_leaf and tensor.requires_grad else 0)
    if uses > own_cpp:
        return "elsewhere"
    # Python references: `held`, `tensor` here, getrefcount's argument, each packed object,
    # and the C++ side's own reference to the Python object while it holds the tensor too.
    # (Releases before 2.9 keep the Python object alive by other means: no such reference.)
    cpp_ref = 1 if uses > 1 and torch_api.CPP_HOLDERS_REFERENCE_THE_PYTHON_OBJECT else 0
    if sys.getrefcount(tensor) - 3 - packs - cpp_ref > 0:
        return "user tensor" if packs or slots else "live tensor"
    return ""
