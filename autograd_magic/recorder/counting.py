"""Counted steps (issue 34): the cheap counters watch mode runs between captured steps.

`StepCounter` installs saved-tensor hooks on one thread (no function mode, no records, no stack
walks) and wraps `torch.autograd.backward` / `torch.autograd.grad`. Per saved tensor it does what
the full recorder does to keep PyTorch's behaviour (`saved.PackedSaved`: a saved input kept whole,
a saved output as a detached alias, the version checked at unpack) plus a few counter updates;
per backward call it tags each root node with a death tag in `node.metadata`. What it counts:
live backward roots, live saved tensors, live saved bytes (distinct storages nothing else holds)
and their peak within a step, the backward calls of a step.

Counters written by finalizers (which may run on autograd's threads) are kept apart from those the
pack hook writes: each is then only ever changed by one kind of writer, and a live figure is a
difference of the two. With the compiled helper (`autograd_magic._counted`, built with the
recorder's) the pack and unpack hooks and the packed object's death are C, and the counters live
in its `Packer`; the pure-Python `_Tally` and pack hook below are the reference and the fallback,
with the same results (tests/test_counting.py runs both).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from autograd_magic.model.records import BlindspotKind
from autograd_magic.model.watch import HeldSaved, StepCounts, StepLog
from autograd_magic.recorder import counted_calls, install, native, stacks, torch_api
from autograd_magic.recorder.deferred import finalizer, hold, pending, raise_pending
from autograd_magic.recorder.nodes import current_sequence_nr
from autograd_magic.recorder.saved import PackedSaved, may_own_saved, storage_of

_get_ident = threading.get_ident
_compiled = native.COUNTED
_node_sequence_nr = torch_api.node_sequence_nr
_serials = itertools.count(1)
# Take an object out of the cycle collector's view (compiled helper; None without it). What the
# pack hook makes (packed objects, storage entries, root tags) is referenced only by autograd's
# C++ slots and our tables and can be in no cycle; tracked, each would count toward the user's
# collections and survive with its graph into the oldest generation (as `packing` says).
_untrack: Callable[[Any], Any] | None = None if native.NATIVE is None else native.NATIVE.untrack

# Fields of an entry of `StepCounter._live` (one per distinct saved storage), a list for speed.
_USES, _BYTES, _COUNTED, _SHAPE, _DTYPE, _LINE, _MODULE, _HELD_BY = range(8)


class _RootTag:
    """Stored in a backward root's `node.metadata`: dies with the C++ node. Holds its tally
    weakly, so a tag outliving its counter reports to no one (the pure-Python form of the
    compiled `Packer.root_tag()`)."""

    __slots__ = ("tally_ref",)

    def __init__(self, tally_ref: weakref.ref[_Tally]) -> None:
        self.tally_ref = tally_ref

    @finalizer
    def __del__(self) -> None:
        ref = self.tally_ref  # before the guard: see deferred.finalizer
        try:
            tally = ref()
            if tally is not None:
                tally.roots_died += 1
        except Exception:
            pass
        except BaseException as error:
            hold(error)


class _Tally:
    """The pure-Python counters (the compiled `Packer` has the same fields): what was packed and
    released, in tensors and counted bytes, the peak this step, and what a new storage notes."""

    __slots__ = (
        "__weakref__",
        "frame",
        "module",
        "on_pile",
        "packed",
        "packed_bytes",
        "peak",
        "pile_limit",
        "released",
        "released_bytes",
        "roots_died",
    )

    def __init__(self) -> None:
        self.frame: FrameType | None = None  # the block's frame, only while installed
        self.module = ""  # the top-level module running now ("" outside any)
        # Called once when the live counted bytes pass `pile_limit` (0: never); see
        # `StepCounter.watch_pile`.
        self.pile_limit = 0
        self.on_pile: Callable[[], Any] | None = None
        # Written by the pack hook and end_step (installing thread) only:
        self.packed = self.packed_bytes = self.peak = 0
        # Written by finalizers only (any thread):
        self.released = self.released_bytes = self.roots_died = 0

    def root_tag(self) -> _RootTag:
        """A tag for a backward root's `node.metadata`: its death counts in `roots_died`."""
        return _RootTag(weakref.ref(self))


if _compiled is not None:
    from autograd_magic.recorder import deferred, inplace_text, saved

    _compiled.configure(
        pending=pending,
        raise_pending=deferred.raise_pending,
        may_own_saved=may_own_saved,
        unlisted_detach=saved._unlisted_detach,
        profiler_enabled=torch_api.profiler_enabled,
        storage_of=storage_of,
        slots=saved.SLOTS,
        version_error=saved.version_error_text,
        detached_message=inplace_text.DETACHED_MESSAGE,
        parameter_type=torch.nn.Parameter,
        tensor_type=torch.Tensor,
    )


class StepCounter:
    """Counts what autograd holds, step by step, at the cost of a pack hook (see the module).

    `install()` starts counting on the calling thread, `remove()` undoes all of it (idempotent).
    `end_step()` returns the counters and starts the next step; `on_backward_end()` is called
    after each outermost backward call on that thread, also when it raises. `block_frame`, if
    given, is the watched block's frame: each saved storage notes its current line."""

    def __init__(
        self,
        block_frame: FrameType | None = None,
        on_backward_end: Callable[[], None] | None = None,
    ) -> None:
        self._block_frame = block_frame
        self.on_backward_end = on_backward_end
        self._ref = weakref.ref(self)
        self._key = f"autograd_magic:root:{next(_serials)}"
        self.thread = 0
        self._installed = False
        self._suspended = False
        self._pack: Callable[[torch.Tensor], Any] | None = None
        # Distinct saved storages alive: storage key (a negative serial for storage-less
        # tensors) -> [uses, bytes, counted, shape, dtype, line, module, held_by].
        self._live: dict[int, list[Any]] = {}
        self._tally: Any = _Tally() if _compiled is None else _compiled.Packer(self._live, _peek())
        # Written by the backward wrapper (installing thread) only:
        self._roots_tagged = 0
        self._step = 0
        self._calls = 0
        self.depth = 0
        self._module_depth = 0
        self.module_calls = 0  # module calls seen on the installing thread (nested ones too)
        self._modules = False  # whether the global module hooks tell this counter of calls
        # Live counted bytes at the last step end, and the most a step saved above what the
        # step before it left (a step's own forward; watch mode adds its captured steps'): the
        # pile limit's unit.
        self._end_bytes = 0
        self.step_bytes = 0

    @property
    def block_frame(self) -> FrameType | None:
        """The watched block's frame: each new saved storage notes its line (None: line 0)."""
        return self._block_frame

    @block_frame.setter
    def block_frame(self, frame: FrameType | None) -> None:
        self._block_frame = frame
        if self._installed:
            self._tally.frame = frame

    @property
    def module(self) -> str:
        """The top-level module running now ("" outside any)."""
        return str(self._tally.module)

    # --- the counters -----------------------------------------------------------------------

    @property
    def live_roots(self) -> int:
        """Tagged backward roots whose node is alive."""
        return int(self._roots_tagged - self._tally.roots_died)

    @property
    def live_saved(self) -> int:
        """Saved tensors autograd still holds (packed by this counter)."""
        tally = self._tally
        return int(tally.packed - tally.released)

    @property
    def live_bytes(self) -> int:
        """Bytes of the distinct saved storages that only the graph holds."""
        tally = self._tally
        return int(tally.packed_bytes - tally.released_bytes)

    @property
    def backward_calls(self) -> int:
        """Outermost backward calls in the current step."""
        return self._calls

    def end_step(self, captured: bool = False, step: int | None = None) -> StepCounts:
        """The counters now, as the end of the current step (numbered `step`, else this
        counter's own count from 0); the next step starts."""
        number = self._step if step is None else step
        calls, roots, saved, live, peak = self._close_step()
        return StepCounts(number, calls, roots, saved, live, peak, captured)

    def end_counted_step(self, log: StepLog, step: int) -> None:
        """`end_step` for a counted step: its counters go into `log` as one row, no object
        made (the path every counted step takes); what it saved sizes `step_bytes`."""
        start = self._end_bytes
        calls, roots, saved, live, peak = self._close_step()
        if peak - start > self.step_bytes:
            self.step_bytes = peak - start
        log.add(step, calls, roots, saved, live, peak)

    def _close_step(self) -> tuple[int, int, int, int, int]:
        """The current step's backward calls, live roots, live saved tensors, retained and
        peak bytes; the next step starts."""
        tally = self._tally
        live = tally.packed_bytes - tally.released_bytes
        peak = tally.peak
        values = (
            self._calls,
            self._roots_tagged - tally.roots_died,
            tally.packed - tally.released,
            live,
            peak if peak > live else live,
        )
        self._step += 1
        self._calls = 0
        tally.peak = live
        self._end_bytes = live
        return values

    def watch_pile(self, steps: float, on_pile: Callable[[], Any] | None) -> None:
        """Call `on_pile()` once if the live counted bytes pass what they are now plus `steps`
        times the most a counted step saved (forward passes with no backward keeping their
        graphs); `on_pile=None` (or no counted step yet) disarms it."""
        tally = self._tally
        if on_pile is None or self.step_bytes <= 0:
            tally.pile_limit = 0
            tally.on_pile = None
            return
        tally.on_pile = on_pile
        tally.pile_limit = tally.packed_bytes - tally.released_bytes + int(steps * self.step_bytes)

    def held_now(self) -> list[HeldSaved]:
        """What the live saved tensors hold, one entry per distinct storage, largest first."""
        held = [
            HeldSaved(
                nbytes=entry[_BYTES],
                shape=tuple(entry[_SHAPE]),
                dtype=str(entry[_DTYPE]).replace("torch.", ""),
                line=entry[_LINE],
                module=entry[_MODULE],
                held_by=entry[_HELD_BY],
            )
            for entry in list(self._live.values())
        ]
        held.sort(key=lambda h: -h.nbytes)
        return held

    def buffer_released(self, buffer_id: int, storage_key: int) -> None:
        """A pure-Python packed object died (autograd let go of a saved tensor): called by its
        finalizer."""
        tally = self._tally
        tally.released += 1
        live = self._live
        entry = live.get(buffer_id)
        if entry is None:
            return
        entry[_USES] -= 1
        if entry[_USES] <= 0:
            live.pop(buffer_id, None)
            if entry[_COUNTED]:
                tally.released_bytes += entry[_BYTES]

    # --- install / remove -------------------------------------------------------------------

    def install(self) -> None:
        """Start counting on this thread: saved-tensor hooks, the backward wrappers, the global
        module hooks. Anything half-installed when this raises is taken out again."""
        if self._installed:
            return
        self.thread = _get_ident()
        self._installed = True
        try:
            stacks.remove_stranded_hooks()
            self._tally.frame = self._block_frame
            self._pack = self._tally if _compiled is not None else self._pack_hook()
            install.add_patches(self)
            if install.hooks_disabled_message() is None:
                stacks.push_hooks(self._pack, _UNPACK)
            else:  # inside torch.func or disable_saved_tensors_hooks: wait for them to end
                self._suspended = True
                install.suspended_until_enabled(self)
            counted_calls.add_counter(self)
            counted_calls.join_module_hooks(self)
            self._modules = True
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """Take out everything `install` put in (idempotent; from any thread: hooks installed on
        another thread are left for that thread to take off, see `stacks.strand`)."""
        if not self._installed:
            return
        self._installed = False
        self._tally.frame = None  # a packed object outliving the block must not hold its locals
        self.watch_pile(0, None)  # its callback holds the watch: no cycle outlives the block
        self.stop_modules()
        counted_calls.remove_counter(self)
        install.remove_patches(self)
        pack, self._pack = self._pack, None
        if pack is not None and not self._suspended:
            if _get_ident() == self.thread:
                stacks.remove_hooks(pack)
            else:
                stacks.strand(self.thread, pack)
        self._suspended = False

    def __enter__(self) -> StepCounter:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # --- the pack hook ----------------------------------------------------------------------

    def _pack_hook(self) -> Callable[[torch.Tensor], Any]:
        """This counter's pack hook: a closure, so its per-save reads are local variables."""
        tally = self._tally
        ref = self._ref
        live = self._live
        peek = _peek()
        sequence_nr = _node_sequence_nr
        negative = itertools.count(-1, -1)
        untrack = _untrack

        def pack(tensor: torch.Tensor) -> PackedSaved:
            if pending:
                raise_pending()
            grad_fn: Any = tensor.grad_fn
            # PyTorch keeps a saved input or leaf whole, a saved output (whose grad_fn is the
            # node being built: the newest on this thread) as its data only (trap 1).
            # (The cheaper sequence test first: most saved tensors with a grad_fn are inputs.)
            keep = (
                grad_fn is None
                or sequence_nr(grad_fn) != peek() - 1
                or not may_own_saved(type(grad_fn))
            )
            packed = PackedSaved(tensor, grad_fn, ref, 0, keep)
            tally.packed += 1  # at once: its finalizer counts it released
            if untrack is not None:
                untrack(packed)
            key, size = storage_of(tensor)
            if not key:
                key = next(negative)
            packed.buffer_id = key
            counted = not packed.held_by
            entry = live.get(key)
            if entry is None:
                frame = tally.frame  # read here: it may be set after install
                line = 0 if frame is None else frame.f_lineno
                entry = [
                    1, size, counted, tensor.shape, tensor.dtype, line, tally.module,
                    packed.held_by,
                ]  # fmt: skip
                live[key] = entry if untrack is None else untrack(entry)
            else:
                entry[_USES] += 1
                if not counted or entry[_COUNTED]:
                    return packed
                entry[_COUNTED] = True  # a storage first saved through a parameter's view
            if counted:
                total = tally.packed_bytes + size
                tally.packed_bytes = total
                total -= tally.released_bytes
                if total > tally.peak:
                    tally.peak = total
                if 0 < tally.pile_limit < total:
                    _pile_passed(tally)
            return packed

        return pack

    # --- counted_calls.Counter: what the shared entry points call ----------------------------

    def stop_modules(self) -> None:
        """Stop attributing saved bytes to modules: the global module hooks go (see
        `model.watch.module_hooks_too_costly`); what is saved from now on has module ""."""
        if self._modules:
            self._modules = False
            counted_calls.leave_module_hooks(self)
            self._module_depth = 0
            self._tally.module = ""

    def module_entered(self, module: torch.nn.Module) -> None:
        if _get_ident() != self.thread:
            return
        self.module_calls += 1
        self._module_depth += 1
        if self._module_depth == 1:
            if type(module).__name__ == counted_calls.WRAPPED:
                # Its compiled code calls the inner module with no hook: name that one.
                module = next(module.children(), module)
            self._tally.module = type(module).__name__

    def module_left(self) -> None:
        if _get_ident() != self.thread:
            return
        self._module_depth -= 1
        if self._module_depth <= 0:
            self._module_depth = 0
            self._tally.module = ""

    def backward_starts(self, roots: Any) -> None:
        """Count an outermost backward call and tag its roots' nodes (each node once)."""
        self._calls += 1
        if isinstance(roots, torch.Tensor):
            roots = (roots,)
        elif not isinstance(roots, (tuple, list)):
            return  # an iterator: reading it would consume the user's roots
        key = self._key
        for root in roots:
            node: Any = (
                root.grad_fn if isinstance(root, torch.Tensor) else getattr(root, "node", None)
            )
            if node is None:
                continue
            metadata = node.metadata
            if key not in metadata:
                tag = self._tally.root_tag()
                metadata[key] = tag if _untrack is None else _untrack(tag)
                self._roots_tagged += 1

    # --- install.Patched: what the shared patches call --------------------------------------

    def from_numpy_made(self, tensor: torch.Tensor, array: Any) -> None:
        pass

    def user_hooks_entered(self) -> None:
        pass

    def forget(self, obj: Any) -> None:
        pass

    def suspend(self, kind: BlindspotKind, message: str) -> bool:
        """Take the hooks off where PyTorch allows none (torch.func, hooks disabled)."""
        if not self._installed or _get_ident() != self.thread or self._suspended:
            return False
        if self._pack is not None:
            stacks.remove_hooks(self._pack)
        self._suspended = True
        return True

    def resume(self) -> None:
        """Undo `suspend` (nothing once removed)."""
        if self._suspended and self._installed and self._pack is not None:
            self._suspended = False
            stacks.push_hooks(self._pack, _UNPACK)


def _pile_passed(tally: _Tally) -> None:
    """Live counted bytes passed the pile limit: disarm it and tell `on_pile`, once (its errors
    are dropped: the user's op that saved the tensor must not fail for the watcher's sake)."""
    tally.pile_limit = 0
    on_pile = tally.on_pile
    if on_pile is not None:
        with contextlib.suppress(Exception):
            on_pile()


def _peek() -> Callable[[], int]:
    """The next node's sequence number on this thread: torch's own read, or a probe node's."""
    return torch_api.current_sequence_nr_peek or _probing_peek()


def _probing_peek() -> Callable[[], int]:
    """`peek` where torch has no `_get_sequence_nr`: each probe node takes a number, so a probe
    right after our previous one (no node made between them) reports what that one did."""
    last = [-2, 0]  # the previous probe's number, what it reported

    def peek() -> int:
        probe = current_sequence_nr()
        if probe - 1 != last[0]:
            last[1] = probe
        last[0] = probe
        return last[1]

    return peek


def _unpack(packed: Any) -> torch.Tensor:
    # PyTorch skips its in-place check while hooks are on: `checked_tensor` redoes it (trap 2).
    if type(packed) is PackedSaved:
        return packed.checked_tensor()
    return packed


_UNPACK: Callable[[Any], torch.Tensor] = _unpack if _compiled is None else _compiled.unpack
