"""Shared memory and version counters: alias links (detach, views, .data, NumPy), copies, and
in-place writes, including writes that bypass autograd's version counter.
"""

from __future__ import annotations

import weakref
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from autograd_magic.model.records import AliasLink, Site, VersionBump
from autograd_magic.recorder.identity import ObjectRegistry
from autograd_magic.recorder.ops import VERSION_SHARING_HOWS, OpKind
from autograd_magic.recorder.saved import PackedSaved, storage_of
from autograd_magic.recorder.torch_api import version_of

if TYPE_CHECKING:
    from autograd_magic.recorder.sites import SiteFinder
    from autograd_magic.recorder.writer import TraceWriter

NUMPY_WATCH_MAX_BYTES = 16 * 2**20
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_INPLACE_WHAT: dict[str, str] = {}  # op name -> its timeline label, built once per op
# Released buffers' and dead objects' entries are dropped in bulk, at least this often; a bulk
# prune of the saved-buffer table waits for twice its size in new entries (amortised O(1) per
# buffer), so what a long loop leaves between prunes stays a fraction of what is alive.
PRUNE_EVERY = 256


def _is_ndarray(obj: Any) -> bool:
    return type(obj).__name__ == "ndarray" and type(obj).__module__ == "numpy"


def _address_range(obj: Any) -> tuple[int, int]:
    if isinstance(obj, torch.Tensor):
        start, size = storage_of(obj)
        return start, start + size
    start = obj.__array_interface__["data"][0]
    return start, start + obj.nbytes


def shares_memory(a: Any, b: Any) -> bool:
    """True when two tensors/arrays overlap in memory (and are not empty)."""
    a0, a1 = _address_range(a)
    b0, b1 = _address_range(b)
    return a0 != 0 and b0 != 0 and a0 < b1 and b0 < a1


class _NumpyWatch:
    """Detects NumPy writes to memory a tensor shares: content changed, version did not."""

    __slots__ = ("array_ref", "array_uid", "digest", "tensor_ref", "tensor_uid", "version")

    def __init__(self, array: Any, tensor: torch.Tensor, array_uid: int, tensor_uid: int) -> None:
        self.array_ref = weakref.ref(array)
        self.tensor_ref = weakref.ref(tensor)
        self.digest = _digest(array)
        self.version = version_of(tensor)
        self.array_uid = array_uid
        self.tensor_uid = tensor_uid


def _refs(entry: Any) -> list[weakref.ref[PackedSaved]]:
    """The weak references of one `_live_saved` entry (none, one, or a list)."""
    if entry is None:
        return []
    return list(entry) if type(entry) is list else [entry]


def _digest(array: Any) -> int:
    return zlib.crc32(array.tobytes())


class AliasTracker:
    """Records alias/copy links and version bumps, through the trace's writer."""

    def __init__(self, writer: TraceWriter, sites: SiteFinder) -> None:
        self.writer = writer
        self.trace = writer.trace  # read only
        self.sites = sites
        self.registry = ObjectRegistry()
        self._separate_counter: dict[int, int] = {}  # alias uid -> source uid (.data, NumPy)
        # storage key -> weak reference(s) to the live saved buffers on it, in saving order
        self._live_saved: dict[int, Any] = {}
        self._watched = 0
        self._next_prune = PRUNE_EVERY  # `_watched` count at which to prune `_live_saved`
        self._numpy_watches: list[_NumpyWatch] = []
        self._shared_with: dict[int, set[int]] = {}  # uid -> uids linked by shared memory
        # storage key -> the NumPy array whose memory a tensor uses (from_numpy, as_tensor)
        self._numpy_owners: dict[int, weakref.ref[Any]] = {}

    # ----- saved buffers on a storage ----------------------------------------------------
    def watch_saved(self, packed: PackedSaved) -> None:
        """Remember a live saved buffer by storage so in-place writes can be matched to it."""
        # One weak reference per storage (most storages hold one saved buffer), a list of them
        # for more: no dict per storage for the cycle collector to scan.
        table = self._live_saved
        key = packed.storage_key
        ref = weakref.ref(packed)
        if self.writer.untrack is not None:
            self.writer.untrack(ref)  # no callback: it holds nothing, so it is in no cycle
        entry = table.get(key)
        if entry is None:
            table[key] = ref
        elif type(entry) is list:
            entry.append(ref)
        else:
            table[key] = [entry, ref]
        self._watched += 1
        if self._watched >= self._next_prune:
            self._prune_saved()

    def live_saved_on(self, storage_key: int) -> list[PackedSaved]:
        """The saved buffers autograd still holds on one storage (the released ones' entries
        go now: a parameter's storage is saved again each step of a loop, and written)."""
        entry = self._live_saved.get(storage_key)
        if type(entry) is not list:
            packed = None if entry is None else entry()
            return [] if packed is None else [packed]
        live = [(r, p) for r in entry if (p := r()) is not None]
        if len(live) < len(entry):
            entry[:] = [r for r, _ in live]
        return [p for _, p in live]

    def numpy_owner(self, storage_key: int) -> Any:
        """The NumPy array that owns a storage's memory, while it lives (else None)."""
        ref = self._numpy_owners.get(storage_key)
        return None if ref is None else ref()

    def _prune_saved(self) -> None:
        """Drop entries of released buffers in bulk (cheaper than a callback per buffer)."""
        table = self._live_saved
        for key in list(table):
            live = [r for r in _refs(table[key]) if r() is not None]
            if not live:
                del table[key]
            else:
                table[key] = live[0] if len(live) == 1 else live
        self._next_prune = self._watched + max(PRUNE_EVERY, 2 * len(table))

    def _saved_on(self, tensor: torch.Tensor, saved_before: int) -> tuple[list[int], list[int]]:
        """Live buffers saved before the write on `tensor`'s memory: (those whose version check
        will now fail, those changed without their version moving)."""
        failing: list[int] = []
        silent: list[int] = []
        if self.writer.live_buffers <= 0:  # nothing saved is alive: no buffer to look up
            return failing, silent
        for packed in self.live_saved_on(storage_of(tensor)[0]):
            # Buffers with a later id were saved by the writing op itself (relu_ saves its output).
            if packed.buffer_id > saved_before:
                continue
            unchanged = version_of(packed.tensor) == packed.version
            (silent if unchanged else failing).append(packed.buffer_id)
        return failing, silent

    # ----- in-place writes ---------------------------------------------------------------
    def run_inplace(
        self, func: Callable[..., Any], op: str, args: tuple, kwargs: dict, call: Callable[..., Any]
    ) -> Any:
        """Run an op (through `call`) that may write in place and record each version bump."""
        __tracebackhide__ = True
        first = args[0] if args else None
        if (type(first) is _Tensor or type(first) is _Parameter) and "out" not in kwargs:
            # The common write (an optimizer's add_, a module's relu_): its one target, read
            # without building lists (what `_write_targets` gives for it).
            if first.is_inference():
                return call(func, args, kwargs)
            old = version_of(first)
            saved_before = self.trace.buffers_saved
            out = call(func, args, kwargs)
            new = version_of(first)
            if new != old:
                self._record_bump(first, op, old, new, self.sites.here(), saved_before)
            return out
        targets = _write_targets(args, kwargs)
        before = [version_of(t) for t in targets]
        saved_before = self.trace.buffers_saved
        out = call(func, args, kwargs)
        site = None
        for tensor, old in zip(targets, before, strict=True):
            new = version_of(tensor)
            if new != old:
                site = site or self.sites.here()
                self._record_bump(tensor, op, old, new, site, saved_before)
        return out

    def hidden_write(
        self, tensor: torch.Tensor, call: str, old: int, new: int, saved_before: int
    ) -> None:
        """The version of `tensor` moved across `call`, which is no in-place op: a write inside
        a library function's body. Recorded only when it breaks a live saved buffer (what the
        user can act on; a library's running statistics move every step)."""
        if not self._saved_on(tensor, saved_before)[0]:
            return
        self._record_bump(tensor, call, old, new, self.sites.here(), saved_before, hidden=True)

    def _record_bump(
        self,
        tensor: torch.Tensor,
        op: str,
        old: int,
        new: int,
        site: Site,
        saved_before: int,
        hidden: bool = False,
    ) -> None:
        writer = self.writer
        uid = self._uid(tensor, "tensor")
        label = writer.name(uid, self.registry.op_labels[uid])
        failing, silent = self._saved_on(tensor, saved_before)
        source = self._separate_counter.get(uid)
        # A write through a separate counter (.data, NumPy) leaves saved copies looking intact.
        bypass = bool(silent) or source is not None
        hits = silent if bypass and silent else failing
        sharers = self._live_sharers(uid)
        # Positional: a dataclass's __init__ takes keywords slower (one write per optimizer op).
        seq = writer.next_seq()
        bump = VersionBump(
            label,
            op,
            old,
            new,
            seq,
            site,
            uid,
            tuple(hits),
            (),
            bypass,
            source or 0,
            "",
            sharers,
            (),
            hidden,
            writer.module if hidden else None,
        )
        what = _INPLACE_WHAT.get(op)
        if what is None:
            what = _INPLACE_WHAT[op] = f"in-place {op}"
        writer.version_bump(bump, what)
        if self._numpy_watches:
            self._rebase_numpy_watches(tensor)

    def _rebase_numpy_watches(self, tensor: torch.Tensor) -> None:
        """A torch write on memory a NumPy array shares is recorded already: not a NumPy write."""
        for watch in self._numpy_watches:
            watched = watch.tensor_ref()
            array = watch.array_ref()
            if watched is not None and array is not None and shares_memory(watched, tensor):
                watch.digest, watch.version = _digest(array), version_of(watched)

    def _uid(self, obj: Any, hint: str) -> int:
        """The registry's id for `obj`; every so many deaths, their per-object state is dropped
        (one place for every path that registers objects, so none grows unbounded)."""
        if self.registry.dead_count() >= PRUNE_EVERY:
            self._drop_dead()
        return self.registry.uid(obj, hint)

    def _drop_dead(self) -> None:
        """Forget sharing and counters of dead objects, keeping their live partners linked to
        each other (memory shared through a dead view is still shared)."""
        shared = self._shared_with
        for uid in self.registry.take_dead():
            self._separate_counter.pop(uid, None)
            partners = shared.pop(uid, set())
            for partner in partners:
                others = shared.get(partner)
                if others is not None:
                    others.discard(uid)
                    others.update(p for p in partners if p != partner)
                    if not others:
                        del shared[partner]

    def _live_sharers(self, uid: int) -> tuple[int, ...]:
        """Other live tensors/arrays that share memory with `uid` (transitively)."""
        if uid not in self._shared_with:
            return ()
        seen, stack = {uid}, [uid]
        while stack:
            for other in self._shared_with.get(stack.pop(), ()):
                if other not in seen:
                    seen.add(other)
                    stack.append(other)
        seen.discard(uid)
        return tuple(sorted(u for u in seen if self.registry.get(u) is not None))

    def check_numpy_writes(self) -> None:
        """Record NumPy writes (invisible to autograd) since the last check as bypassing bumps."""
        if not self._numpy_watches:
            return
        kept, noted = [], set()
        for watch in self._numpy_watches:
            array, tensor = watch.array_ref(), watch.tensor_ref()
            if array is None or tensor is None:
                continue
            kept.append(watch)
            digest, version = _digest(array), version_of(tensor)
            # Several watches can cover one memory block (from_numpy, as_tensor, .numpy()):
            # one write is one record.
            memory = _address_range(array)
            if digest != watch.digest and version == watch.version and memory not in noted:
                noted.add(memory)
                self._record_numpy_write(watch, tensor)
            watch.digest, watch.version = digest, version
        self._numpy_watches = kept

    def _record_numpy_write(self, watch: _NumpyWatch, tensor: torch.Tensor) -> None:
        writer = self.writer
        _, hits = self._saved_on(tensor, self.trace.buffers_saved)
        site = self.sites.here()
        bump = VersionBump(
            label=self.trace.labels.get(watch.array_uid, ""),
            op="numpy write",
            old=watch.version,
            new=watch.version,
            seq=writer.next_seq(),
            site=site,
            object_id=watch.array_uid,
            hit_buffers=tuple(hits),
            bypass=True,
            bypassed_id=watch.tensor_uid,
        )
        writer.version_bump(bump, None)

    # ----- aliases and copies ------------------------------------------------------------
    def link(self, out: Any, source: Any, op: str, kind: OpKind) -> None:
        """Record how `out` relates to `source`: same memory (alias) or a copy."""
        if source is None or not (isinstance(source, torch.Tensor) or _is_ndarray(source)):
            return
        outs = out if isinstance(out, (tuple, list)) else (out,)
        site = None
        for item in outs:
            if item is source or not (isinstance(item, torch.Tensor) or _is_ndarray(item)):
                continue
            shares = kind is not OpKind.COPY and shares_memory(item, source)
            site = site or self.sites.here()
            self._add_link(item, source, op, kind, shares, site)

    def _add_link(
        self, item: Any, source: Any, op: str, kind: OpKind, shares: bool, site: Site
    ) -> None:
        writer, registry = self.writer, self.registry
        source_uid = self._uid(source, "ndarray" if _is_ndarray(source) else "tensor")
        item_uid = self._uid(item, op)
        for uid in (source_uid, item_uid):
            writer.name(uid, registry.op_labels[uid], registry.kinds[uid])
        how = op if shares else f"{op} (copy)" if kind is OpKind.ALIAS else op
        writer.link(AliasLink(item_uid, source_uid, how, shares, writer.next_seq(), site))
        if shares:
            self._shared_with.setdefault(item_uid, set()).add(source_uid)
            self._shared_with.setdefault(source_uid, set()).add(item_uid)
        # `.data` (tensor to tensor) gets its own version counter: writes through it bypass the
        # source's. A from_numpy tensor has a normal counter; NumPy writes are watched below.
        separate = isinstance(item, torch.Tensor) and isinstance(source, torch.Tensor)
        if shares and separate and how not in VERSION_SHARING_HOWS:
            self._separate_counter[item_uid] = source_uid
        if shares and (_is_ndarray(item) or _is_ndarray(source)):
            array, tensor = (item, source) if _is_ndarray(item) else (source, item)
            if array is source:  # the tensor uses the array's memory (from_numpy)
                self._numpy_owners[storage_of(tensor)[0]] = weakref.ref(array)
            if array.nbytes <= NUMPY_WATCH_MAX_BYTES and not tensor.is_inference():
                array_uid = item_uid if array is item else source_uid
                tensor_uid = source_uid if array is item else item_uid
                self._numpy_watches.append(_NumpyWatch(array, tensor, array_uid, tensor_uid))

    def release(self) -> None:
        """Let go of every weak reference to the user's tensors and arrays (the block has
        ended and been named)."""
        self.registry.release()
        self._numpy_watches = []
        self._live_saved.clear()
        self._numpy_owners.clear()


def _write_targets(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    targets: list[torch.Tensor] = []
    first = args[0] if args else kwargs.get("input", kwargs.get("tensor", kwargs.get("self")))
    for candidate in (first, kwargs.get("out")):
        if isinstance(candidate, torch.Tensor):
            targets.append(candidate)
        elif isinstance(candidate, (list, tuple)):
            targets.extend(t for t in candidate if isinstance(t, torch.Tensor))
    # Inference tensors have no version counter (reading it raises).
    return [t for t in targets if not t.is_inference()]
