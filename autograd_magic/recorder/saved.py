"""Saved-tensor hooks: see every tensor autograd saves for backward, and when it lets go.

Two traps shape this module: the packed object keeps `t.detach()`, never `t` (a saved output's
`grad_fn` is the saving node, so keeping `t` makes an uncollectable cycle), and `unpack` re-does
the checks PyTorch skips while hooks are installed (in place modified, detached in place). What
is read to assign buffers to nodes runs only our own unpack hook (`probe_saved`).
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any

import torch

from autograd_magic.model.records import HeldBy
from autograd_magic.recorder import torch_api
from autograd_magic.recorder.deferred import finalizer, hold
from autograd_magic.recorder.inplace_text import DETACHED_MESSAGE, WORDING


class TensorSlots:
    """Tensors held as autograd's own saved slots hold them: a C++ reference to the tensor
    (its TensorImpl), never one to its Python object.

    So a saved input's use count, refcount and `gc` view are as untracked (PyTorch's
    `swap_tensors` guard counts uses), and reading a slot gives back the user's own object, a
    `Parameter` with its attributes. The table is a typed `List[Tensor]` made in C++
    (`torch_api.new_tensor_list`); a slot is emptied the moment its packed object dies."""

    def __init__(self) -> None:
        self._empty = torch.empty(0)
        self._table: Any = torch_api.new_tensor_list([self._empty])
        self._free: list[int] = []
        self._grow = threading.Lock()

    def hold(self, tensor: torch.Tensor) -> int:
        """A slot now holding `tensor`; -1 where this torch has no such table."""
        table = self._table
        if table is None:
            return -1
        try:
            slot = self._free.pop()  # atomic: finalizers on autograd's threads give slots back
        except IndexError:
            with self._grow:
                slot = len(table)
                table.append(tensor)
            return slot
        table[slot] = tensor
        return slot

    def get(self, slot: int) -> torch.Tensor:
        return self._table[slot]

    def release(self, slot: int) -> None:
        """Let go of the slot's tensor now (what autograd's slot does when it is released)."""
        table = self._table
        # Taken out first so that its last reference dies here, in Python, and not inside the
        # list's C++ assignment, where a finalizer it runs could append to the same list.
        tensor = table[slot]
        table[slot] = self._empty
        self._free.append(slot)
        del tensor


SLOTS = TensorSlots()


def _unlisted_detach(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor.detach()`, left out of a running profiler's ops: what PyTorch keeps of a saved
    output untracked is no op either, so the user's op counts stay as they are."""
    if not torch_api.profiler_enabled():
        return tensor.detach()
    torch_api.enable_record_function(False)  # a profiler is on, so it was on
    try:
        return tensor.detach()
    finally:
        torch_api.enable_record_function(True)


class PackedSaved:
    """What autograd holds in a saved slot while our hooks are on; its death = buffer released."""

    __slots__ = (
        "__weakref__",
        "buffer_id",
        "grad_fn_name",
        "had_grad_fn",
        "held_by",
        "kept",
        "nbytes",
        "output_nr",
        "slot",
        "storage_key",
        "version",
        "writer_ref",
    )

    def __init__(
        self,
        tensor: torch.Tensor,
        grad_fn: Any,
        writer_ref: weakref.ref[Any],  # to what has buffer_released(): a writer, a counter
        buffer_id: int,
        keep_original: bool = False,
    ) -> None:
        # PyTorch itself keeps a saved input or leaf (its TensorImpl, whose Python object then
        # lives on with the graph) but only the data of a saved output. Doing the same keeps
        # every freeing moment, use count and refcount unchanged; `keep_original` is only set
        # when `tensor.grad_fn` cannot be the node being built, so the output cycle of trap 1
        # cannot form.
        self.version = torch_api.version_of(tensor)
        self.writer_ref = writer_ref
        self.buffer_id = buffer_id
        if keep_original:
            self.slot = SLOTS.hold(tensor)
            # Only where there is no slot table: then the Python object is what we can keep.
            self.kept = tensor if self.slot < 0 else None
            # The error message names a kept tensor's producer as it is then (see below).
            self.grad_fn_name = self.output_nr = None
            # A kept non-leaf that loses its grad_fn was detached in place: PyTorch refuses it.
            self.had_grad_fn = grad_fn is not None
        else:
            self.slot = -1
            self.had_grad_fn = False
            self.kept = _unlisted_detach(tensor)
            self.grad_fn_name = None if grad_fn is None else grad_fn.name()
            self.output_nr = tensor.output_nr
        self.held_by = held_by_at_saving(tensor)
        self.nbytes = tensor.numel() * tensor.element_size()
        self.storage_key = 0

    @property
    def tensor(self) -> torch.Tensor:
        """The saved tensor: the user's own object for a kept input, a detached alias else."""
        slot = self.slot
        return SLOTS.get(slot) if slot >= 0 else self.kept  # type: ignore[return-value]

    @property
    def held_in_slot(self) -> bool:
        """True when only a C++ reference holds the tensor (no Python reference of ours)."""
        return self.slot >= 0

    @finalizer
    def __del__(self) -> None:
        # Never raise from a finalizer: it runs inside autograd; an interrupt is held for
        # later (see deferred). A bare try, not contextlib.suppress: this runs once per node
        # or buffer, and the context manager costs more than the bookkeeping. The slot is read
        # before the guard: a finalizer must not begin with `try` (see deferred.finalizer).
        slot = self.slot
        try:
            if slot >= 0:
                SLOTS.release(slot)
            writer = self.writer_ref()
            if writer is not None:
                writer.buffer_released(self.buffer_id, self.storage_key)
        except Exception:
            pass
        except BaseException as error:
            hold(error)

    def checked_tensor(self) -> torch.Tensor:
        """The saved value, raising PyTorch's own error if it was modified in place since saving."""
        __tracebackhide__ = True
        if self.had_grad_fn and self.tensor.grad_fn is None:
            raise RuntimeError(DETACHED_MESSAGE)
        current = torch_api.version_of(self.tensor)
        if current != self.version:
            raise RuntimeError(self._version_error(current))
        return self.tensor

    def _version_error(self, current: int) -> str:
        return version_error_text(
            self.tensor, self.grad_fn_name, self.output_nr, current, self.version
        )


def version_error_text(
    t: torch.Tensor, grad_fn_name: str | None, output_nr: int | None, current: int, saved: int
) -> str:
    """PyTorch's in-place error for a saved tensor at version `saved`, now at `current`."""
    # As torch/csrc/autograd/saved_variable.cpp: a kept input (`output_nr` None) names its
    # producer as it is now (output 0, as PyTorch reports it), a saved output the node that
    # saved it.
    if output_nr is None:
        grad_fn, output_nr = t.grad_fn, 0
        grad_fn_name = None if grad_fn is None else grad_fn.name()
    sizes = ", ".join(str(s) for s in t.shape)
    type_name = _legacy_type_name(t)
    return WORDING.version_error(type_name, sizes, grad_fn_name, output_nr, current, saved)


# Scalar types with a legacy tensor type name (`torch.FloatTensor`); PyTorch names the others
# by backend and scalar type (`CPUBFloat16Type`).
_LEGACY = frozenset({"Byte", "Char", "Short", "Int", "Long", "Half", "Float", "Double"})


def _legacy_type_name(tensor: torch.Tensor) -> str:
    """The tensor's type as PyTorch's in-place error prints it, for every dtype."""
    name = tensor.type()  # 'torch.FloatTensor', 'torch.cuda.BFloat16Tensor'
    scalar = name.rsplit(".", 1)[-1].removesuffix("Tensor")
    if scalar in _LEGACY:
        return name
    device = tensor.device.type
    backend = "CPU" if device == "cpu" else "CUDA" if device == "cuda" else device.upper()
    return f"{backend}{scalar}Type"


def held_by_at_saving(tensor: torch.Tensor) -> HeldBy:
    """Who else surely holds a tensor's memory when it is saved: a leaf that requires grad (or a
    view of one, as addmm saves `weight.t()`) outlives the graph. Anything else counts as the
    graph's until a read (`outside.holder_of`) finds another holder."""
    root = torch_api.base_of(tensor) if torch_api.is_view(tensor) else tensor
    if root is not None and root.is_leaf and root.requires_grad:
        return "parameter" if is_parameter(root) else "user tensor"
    return ""


_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


def is_parameter(tensor: torch.Tensor) -> bool:
    """`isinstance(tensor, nn.Parameter)`, without its metaclass check for the two common types
    (that check costs ~0.3 us, twice per saved tensor). A plain tensor counts only when it
    carries Parameter's `_is_param` mark, as the metaclass check says."""
    cls = type(tensor)
    if cls is _Parameter:
        return True
    if cls is _Tensor:
        return bool(tensor.__dict__) and isinstance(tensor, _Parameter)
    return isinstance(tensor, _Parameter)


_DEVICE_TYPES: dict[torch.device, str] = {}


def storage_of(tensor: torch.Tensor) -> tuple[int, int]:
    """(storage address, storage bytes); (0, tensor bytes) for tensors without plain storage."""
    try:
        storage = tensor.untyped_storage()
        device = storage.device
        kind = _DEVICE_TYPES.get(device)
        if kind is None:  # `device.type` costs ~0.25 us a read: once per device
            kind = _DEVICE_TYPES[device] = device.type
        if kind == "meta":  # FakeTensor: no data (and reading it warns)
            return 0, storage.nbytes()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        # ValueError: an UninitializedParameter (lazy modules) refuses every read.
        return 0, tensor.numel() * tensor.element_size()


_SAVED_ATTRS: dict[type, tuple[str, ...]] = {}


def saved_attribute_names(node_type: type) -> tuple[str, ...]:
    """Names of a node type's attributes that unpack saved tensors (cached per type)."""
    names = _SAVED_ATTRS.get(node_type)
    if names is None:
        names = tuple(a for a in dir(node_type) if a.startswith(torch_api.SAVED_ATTR_PREFIX))
        if issubclass(node_type, torch.autograd.function.BackwardCFunction):
            names += ("saved_tensors",)
        _SAVED_ATTRS[node_type] = names
    return names


_MAY_SAVE: dict[type, bool] = {}


def may_own_saved(node_type: type) -> bool:
    """False for node types known to save no tensor: AccumulateGrad, the nodes PyTorch
    generates with no saved attribute (`TBackward0`), and those whose every saved attribute a
    probe found holding no tensor (`ViewBackward0` saves sizes). A custom C++ node lists none
    and may save: it counts as able to."""
    if _PROBED_ATTRS.get(node_type) == ():
        return False
    answer = _MAY_SAVE.get(node_type)
    if answer is None:
        name = node_type.__name__
        generated = name == "AccumulateGrad" or re.fullmatch(r"\w+Backward\d+", name) is not None
        answer = _MAY_SAVE[node_type] = bool(saved_attribute_names(node_type)) or not generated
    return answer


# Node type -> the saved attributes worth touching: those seen holding no tensor (an int, a
# Scalar, sizes) are dropped once seen, since a generated attribute's type never changes.
_PROBED_ATTRS: dict[type, tuple[str, ...]] = {}


def probe_saved(node: Any, unpack_hook: Any) -> None:
    """Touch each saved attribute of `node` so `unpack_hook` can see which buffers it owns.

    Only attributes whose tensors `unpack_hook` would unpack are read: reading one packed by
    other hooks runs their unpack (non-reentrant checkpoint recomputes the user's forward
    there), and a Function with `clear_saved_tensors_on_access` allows a single read."""
    node_type = type(node)
    names = _PROBED_ATTRS.get(node_type)
    if names is None:
        names = saved_attribute_names(node_type)
    kept = []
    for name in names:
        if not _unpacked_only_by(node, name, unpack_hook):
            kept.append(name)
            continue
        try:
            value = getattr(node, name)
        except Exception:
            kept.append(name)
            continue
        if not _holds_no_tensor(value):
            kept.append(name)
    if len(kept) != len(names) or node_type not in _PROBED_ATTRS:
        _PROBED_ATTRS[node_type] = tuple(kept)


def _unpacked_only_by(node: Any, name: str, unpack_hook: Any) -> bool:
    """True when reading `node.<name>` runs no unpack hook but `unpack_hook` (or none)."""
    if name == "saved_tensors":
        forward = torch_api.forward_class(node)
        if getattr(forward, "clear_saved_tensors_on_access", False):
            return False
    try:
        raw = torch_api.raw_saved(node, name)
    except AttributeError:
        return True  # no SavedTensor behind it: an int, sizes, a scalar
    except Exception:
        return False
    for saved in raw if isinstance(raw, (tuple, list)) else (raw,):
        hook = None if saved is None else torch_api.saved_unpack_hook(saved)
        # UNKNOWN (torch 2.4 tells neither): a node is probed only after our own pack hook saw
        # its op save, so the hooks innermost then were ours.
        if hook is not None and hook is not torch_api.UNKNOWN and hook != unpack_hook:
            return False
    return True


def _holds_no_tensor(value: Any) -> bool:
    """True for values that can never be (or hold) a saved tensor: numbers, sizes, dtypes.
    None and empty sequences say nothing (an optional tensor, an empty tensor list)."""
    if value is None or isinstance(value, torch.Tensor):
        return False
    if isinstance(value, (tuple, list)):
        return bool(value) and not any(v is None or isinstance(v, torch.Tensor) for v in value)
    return True
