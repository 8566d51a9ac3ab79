"""`track()`: instruments autograd while a block runs and folds what happens into a `Trace`.

Installs three things, all removed on exit (exception and KeyboardInterrupt included): a
`TorchFunctionMode` that sees each torch call (cheap; no dispatch mode in the hot path),
saved-tensor hooks, and a wrapper around `torch.from_numpy` (invisible to function modes).
Nodes are tagged through `node.metadata`, whose entries die with the C++ node: that gives
exact death times without holding a reference to any node. An interrupt that lands in one of
those finalizers is held and raised at the block's next torch call, hook or exit (`deferred`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Collection
from types import CodeType, TracebackType
from typing import Any, Literal

import torch

from autograd_magic.model.records import (
    Blindspot,
    BlindspotKind,
    Holder,
    Site,
)
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import describe_error
from autograd_magic.recorder import install, stacks, torch_api
from autograd_magic.recorder.aliases import AliasTracker
from autograd_magic.recorder.backward import run_backward
from autograd_magic.recorder.blind_spots import BlindSpotHandling
from autograd_magic.recorder.caller import CallerStandIns, StandIn
from autograd_magic.recorder.deferred import take
from autograd_magic.recorder.frames import outside_caller
from autograd_magic.recorder.graph_holders import LiveHolderReading, has_graph, noting_holders
from autograd_magic.recorder.labels import resolve_labels
from autograd_magic.recorder.mode import KINDS, RecorderMode, kind_of
from autograd_magic.recorder.module_calls import ModuleTracker
from autograd_magic.recorder.naming import frame_namespace
from autograd_magic.recorder.nodes import (
    NodeRecording,
    current_sequence_nr,
    grad_fn_of,
    tag_maker,
)
from autograd_magic.recorder.ops import OpKind
from autograd_magic.recorder.outside import HolderReading
from autograd_magic.recorder.packing import SavedTensorRecording
from autograd_magic.recorder.sites import SiteFinder, site_of_traceback
from autograd_magic.recorder.tracebacks import strip_recorder_frames
from autograd_magic.recorder.writer import TraceWriter

_NoSubclassDispatch = torch_api.DisableTorchFunctionSubclass
# Tries to remove a block's recorder: an interrupt landing in removal gets another go; a
# removal that fails every time is reported, never retried for good (issue 31).
REMOVAL_TRIES = 5
_NOT_LINKED = frozenset({OpKind.PLAIN, OpKind.INPLACE, OpKind.BACKWARD, OpKind.GRAD})
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


_next_trace_number = 0


class Recorder(
    NodeRecording, SavedTensorRecording, HolderReading, LiveHolderReading, BlindSpotHandling
):
    """Context manager behind `track()`; `__enter__` returns the `Trace` being filled."""

    def __init__(
        self,
        trace: Trace | None = None,
        home_code: CodeType | None = None,
        namespace: dict[str, Any] | None = None,
        name_budget_s: float = 0.25,
        ignore_names: Collection[str] = (),
        on_exit: Callable[[Trace], None] | None = None,
    ) -> None:
        global _next_trace_number
        _next_trace_number += 1
        self.trace = trace if trace is not None else Trace()
        self.writer = TraceWriter(self.trace)
        # Weakly: the recorder holds its writer, and a cycle would be garbage at the end.
        self.writer.read_holders = weakref.WeakMethod(self.read_for_listener)
        # Tags and packed buffers reach the writer weakly: they outlive the block in the graph.
        self._writer_ref = weakref.ref(self.writer)
        self._on_exit = on_exit  # called with the finished trace; must not raise
        self._key = f"autograd_magic:{_next_trace_number}"
        self._home_code = home_code
        self._namespace = namespace
        self._name_budget_s = name_budget_s
        # Names in the namespace that are not the user's (the magic passes a notebook's own).
        self._ignore_names = frozenset(ignore_names)
        self._sites = SiteFinder(home_code)
        self._kinds = KINDS
        self._busy = 0
        self._in_call = False
        self._call_site: Site | None = None
        self._next_node_id = 1
        self._new_tag = tag_maker()
        self._next_buffer_id = 1
        self._unowned: list[int] = []
        self._probe_hits: list[int] | None = None
        self._sequence_start = 0
        self._thread = 0
        self._pack_hook: Any = None
        self._suspended: str | None = None
        self._mode: RecorderMode | None = None
        self._blind_lines: set[tuple[str, int]] = set()
        self.aliases = AliasTracker(self.writer, self._sites)
        self.modules = ModuleTracker(self.writer)
        self._stand_ins = CallerStandIns(namespace)

    # ----- install / remove -------------------------------------------------------------
    def __enter__(self) -> Trace:
        if self._home_code is None:
            self._home_code = self._sites.home_code = outside_caller().f_code
        self.writer.locate = self._sites.here
        self._sequence_start = current_sequence_nr()
        self._thread = threading.get_ident()
        try:
            self._install()
        except BaseException:
            # Raised here (a KeyboardInterrupt included) `with` never calls __exit__.
            self._remove_all()
            raise
        self.trace.read_holders = _holder_reader(weakref.ref(self))
        return self.trace

    def _install(self) -> None:
        stacks.purge_ended_modes(RecorderMode)
        stacks.purge_stranded()
        self._pack_hook, self._mode = self._pack, RecorderMode(self)
        disabled = install.hooks_disabled_message()
        if disabled is None:
            stacks.push_hooks(self._pack_hook, self._unpack)
        stacks.push_mode_innermost(self._mode)
        install.add_patches(self)
        self.modules.install()
        if disabled is not None:
            # Entered where PyTorch refuses saved-tensor hooks (inside a torch.func transform or
            # disable_saved_tensors_hooks): ours join when hooks are enabled again.
            kind: BlindspotKind = (
                "torch.func" if disabled.startswith("torch.func") else "hooks-disabled"
            )
            self._note_blindspot(kind, self._sites.here(), install.DISABLED_MESSAGES[kind])
            self._suspended = "hooks"
            install.suspended_until_enabled(self)

    def _uninstall(self) -> None:
        """Remove this block's mode, hooks and patch routing (idempotent; any order of blocks).
        Every step runs; the first that failed is raised after all of them."""
        failed: Exception | None = None
        for step in (self._remove_patches, self._remove_mode, self._remove_hooks):
            try:
                step()
            except Exception as error:
                failed = failed or error
        if failed is not None:
            raise failed
        self._forget_installed()

    def _remove_patches(self) -> None:
        install.remove_patches(self)
        self.modules.remove()

    def _remove_mode(self) -> None:
        # A block ended on another thread than it began (a generator resumed elsewhere) cannot
        # reach the first thread's stacks: its mode and hooks only pass calls and tensors on
        # until that thread removes them (stacks.strand).
        if self._mode is not None and threading.get_ident() == self._thread:
            stacks.remove_mode(self._mode)

    def _remove_hooks(self) -> None:
        if threading.get_ident() != self._thread:
            stacks.strand(self._thread, self._pack_hook)
        elif self._pack_hook is not None:
            stacks.remove_hooks(self._pack_hook)

    def _forget_installed(self) -> None:
        """What is still installed only passes calls and tensors on (also when its removal
        failed); nothing points back at this recorder."""
        if self._mode is not None:
            # Stashed by torch when interrupted, the mode may come back later: harmless then.
            self._mode.recorder = None
        # The mode and hooks point back at this recorder: drop them so no cycle outlives
        # the block (users may run with gc disabled). The stand-ins hold callers' globals.
        self._mode = self._pack_hook = None
        self._stand_ins.clear()

    def _removal_failed(self, error: BaseException) -> None:
        """Removal failed every try: say so once, leave what stayed passing calls on (the next
        block or `uninstall()` takes it out: ended modes and stranded hooks are purged)."""
        if self._pack_hook is not None:
            stacks.strand(self._thread, self._pack_hook)
        self._forget_installed()
        message = (
            f"autograd_magic could not remove its recorder: {error!r}. What stayed installed "
            "passes calls on unchanged; autograd_magic.uninstall() removes it."
        )
        self.writer.blindspot(Blindspot("internal", message))
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _remove_all(self) -> BaseException | None:
        """`_uninstall`, retried when interrupted, at most `REMOVAL_TRIES` times; returns the
        interruption."""
        interrupted: BaseException | None = None
        for _ in range(REMOVAL_TRIES):
            try:
                self._uninstall()
                return interrupted
            except Exception as error:
                failed: BaseException = error
            except BaseException as error:
                failed = interrupted = error
        self._removal_failed(failed)
        return interrupted

    def listen(self, callback: Callable[[Trace], None] | None, interval_s: float = 0.5) -> None:
        """Call `callback(trace)` while the block runs, at most once per `interval_s` seconds,
        on the user's thread between two torch calls; an exception in it unregisters it."""
        self.writer.listen(callback, interval_s)

    def began_on_this_thread(self) -> bool:
        """True when this block was entered on the calling thread."""
        return self._thread == threading.get_ident()

    def abandon(self) -> None:
        """Remove what this block installed without finishing its trace (`uninstall()`); an
        interrupt that arrived meanwhile is raised once all is removed."""
        interrupted = self._remove_all()
        self.aliases.release()
        self.writer.closed = True
        if interrupted is not None:
            raise interrupted

    def __exit__(
        self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        # `_remove_all` inlined: a KeyboardInterrupt checked on entering a call would escape.
        # Bounded: a removal failing the same way each time must not keep the block (and Stop)
        # from ending.
        self.trace.read_holders = None
        interrupted: BaseException | None = None
        failed: BaseException | None = None
        for _ in range(REMOVAL_TRIES):
            try:
                self._uninstall()
                failed = None
                break
            except Exception as error:
                failed = error
            except BaseException as error:
                failed = interrupted = error
        if failed is not None:
            self._removal_failed(failed)
        try:
            self.read_holders()  # the end state's retained bytes
        except Exception as error:
            self.writer.blindspot(
                Blindspot("internal", f"autograd_magic could not read saved memory: {error!r}")
            )
        if exc is not None:
            try:
                strip_recorder_frames(exc)  # any route then prints the untracked traceback
            except Exception as error:
                self.writer.blindspot(
                    Blindspot("internal", f"autograd_magic left its frames in: {error!r}")
                )
        held = take()  # an interrupt caught in a finalizer: the block ends with it
        if held is not None and interrupted is None and (exc is None or isinstance(exc, Exception)):
            interrupted = held
        # The block's end state is what the user asked about: later deaths are not the block's.
        self.writer.flush()
        self.writer.closed = True
        ended_by = exc if interrupted is None else interrupted
        if ended_by is not None:
            self.writer.block_error(
                f"{type(ended_by).__name__}: {describe_error(ended_by)}",
                site_of_traceback(tb, self._sites),
            )
        namespace = self._namespace
        if namespace is None:
            frame = outside_caller()
            namespace = frame_namespace(frame)
            if namespace is None:
                namespace = dict(frame.f_globals)
                self.writer.blindspot(Blindspot("names", _LOCALS_MESSAGE))
            del frame
        try:
            # Reading the user's tensors (`grad_fn`, names) must reach no user mode or subclass.
            with torch_api.DisableTorchFunction():
                self.finish(namespace)
        except Exception as error:  # never replace the user's exception or result
            self.writer.blindspot(
                Blindspot("internal", f"autograd_magic could not finish this trace: {error!r}")
            )
        finally:
            self._namespace = None
            self.aliases.release()
            self.writer.close()
        if self._on_exit is not None:
            self._on_exit(self.trace)
        if interrupted is not None:
            raise interrupted
        return False

    def finish(self, namespace: dict[str, Any]) -> None:
        """Resolve labels against the user's namespace (the block has ended)."""
        self.aliases.check_numpy_writes()
        holders: list[Holder] = []
        note_holder = noting_holders(self._key, holders)

        # Holders keep a live graph root alive: with no live node there is none to find.
        live = self.trace.live_nodes > 0
        roots = self.modules.root_placeholders()
        # Root modules are looked up in the same walk, under negative ids.
        extra = {id(module): -1 - i for i, module in enumerate(roots.values())}
        names = resolve_labels(
            self.writer,
            self.aliases.registry,
            namespace,
            self._name_budget_s,
            also=note_holder if live else None,
            extra=extra,
            also_wants=has_graph,
            ignore=self._ignore_names,
        )
        root_names = {
            placeholder: name
            for i, placeholder in enumerate(roots)
            if (name := names.get(-1 - i)) is not None
        }
        self.writer.end_modules(root_names)
        self.writer.end_holders(holders)
        self.writer.close()

    # ----- per-call path ----------------------------------------------------------------
    def _on_call(self, func: Any, args: tuple, kwargs: dict, call: StandIn) -> Any:
        __tracebackhide__ = True
        entry = self._kinds.get(func)
        if entry is None:
            entry = kind_of(func)
        kind, name = entry
        if self._busy:
            return func(*args, **kwargs)
        mark = len(self._unowned)
        self._in_call = True
        try:
            if kind is OpKind.PLAIN and "out" not in kwargs:
                out = call(func, args, kwargs)
            elif kind is OpKind.INPLACE or kind is OpKind.PLAIN:
                out = self.aliases.run_inplace(func, name, args, kwargs, call)
            elif kind is OpKind.BACKWARD or kind is OpKind.GRAD:
                out = run_backward(self, func, kind, args, kwargs)
            else:
                out = call(func, args, kwargs)
            # A subclass (an UninitializedParameter too) sees its calls, not our reads.
            with _NoSubclassDispatch():
                if kind not in _NOT_LINKED:  # aliases and copies: the last branch above
                    self.aliases.link(out, args[0] if args else kwargs.get("data"), name, kind)
                self._register_outputs(out, mark)
        finally:
            self._in_call = False
            self._call_site = None
        if self.writer.listener is not None:
            self._notify_listener()
        return out

    def _on_plain(self, func: Any, args: tuple, kwargs: dict | None, call: StandIn) -> Any:
        """`_on_call` for the common op (kind PLAIN, no `out=`), kept short: it runs per op."""
        __tracebackhide__ = True
        mark = len(self._unowned)
        self._in_call = True
        try:
            out = call(func, args, kwargs)
            if type(out) is _Tensor or isinstance(out, _Tensor):
                grad_fn = grad_fn_of(out)
                if grad_fn is not None:
                    metadata = grad_fn.metadata
                    if self._key not in metadata and not self._born_alone(grad_fn, metadata, mark):
                        self._discover([grad_fn], mark)
            elif isinstance(out, (tuple, list)):
                self._register_outputs(out, mark)
        finally:
            self._in_call = False
            self._call_site = None
        if self.writer.listener is not None:
            self._notify_listener()
        return out

    def _on_inplace(self, func: Any, args: tuple, kwargs: dict, call: StandIn) -> Any:
        """`_on_call` for a write on plain tensors (kind INPLACE, no `out=`): an optimizer step
        makes one per parameter and state tensor, so it skips the general path's dispatch."""
        __tracebackhide__ = True
        mark = len(self._unowned)
        self._in_call = True
        try:
            out = self.aliases.run_inplace(func, self._kinds[func][1], args, kwargs, call)
            if type(out) is _Tensor or type(out) is _Parameter:
                grad_fn = grad_fn_of(out)
                # Under no_grad (an optimizer) the target keeps its node, or has none.
                if grad_fn is not None and self._key not in grad_fn.metadata:
                    with _NoSubclassDispatch():
                        self._register_outputs(out, mark)
            else:
                with _NoSubclassDispatch():
                    self._register_outputs(out, mark)
        finally:
            self._in_call = False
            self._call_site = None
        if self.writer.listener is not None:
            self._notify_listener()
        return out

    def _on_subclass(self, func: Any, args: tuple, kwargs: dict, call: StandIn) -> Any:
        """A call on a tensor subclass with its own `__torch_function__`: the subclass sees the
        call itself, never the recorder's bookkeeping (run with subclass dispatch off)."""
        __tracebackhide__ = True
        entry = self._kinds.get(func)
        if entry is None:
            entry = kind_of(func)
        if entry[0] is not OpKind.PLAIN or self._busy or "out" in kwargs:
            # Writes and backward interleave their bookkeeping with the call: recorded as usual
            # (the subclass may see the recorder's reads there).
            return self._on_call(func, args, kwargs, call)
        mark = len(self._unowned)
        self._in_call = True
        try:
            out = call(func, args, kwargs)
            with torch_api.DisableTorchFunctionSubclass():
                self._register_outputs(out, mark)
        finally:
            self._in_call = False
            self._call_site = None
        return out

    # ----- what backward recording asks of the recorder (backward.BackwardHost) ----------
    def site(self) -> Site:
        """The user's source position (`SiteFinder.here`)."""
        return self._sites.here()

    def check_numpy_writes(self) -> None:
        """Record NumPy writes made since the last check."""
        self.aliases.check_numpy_writes()

    def _notify_listener(self) -> None:
        # Busy while a live view renders: torch calls it makes are not the user's ops.
        self._busy += 1
        try:
            self.writer.notify()
        finally:
            self._busy -= 1


def uninstall_this_thread() -> int:
    """Remove every recorder still installed on this thread: running, left behind by an
    interrupt that landed as a block ended, or by a block that ended on another thread; returns
    how many. Their traces stay unfinished."""
    blocks = [
        b for b in install.live_blocks() if isinstance(b, Recorder) and b.began_on_this_thread()
    ]
    for block in blocks:
        block.abandon()
    stacks.purge_ended_modes(RecorderMode)
    return len(blocks) + stacks.purge_stranded()


def _untrack_forked_child() -> None:
    """In a process forked while blocks ran (DataLoader workers, multiprocessing): nobody reads
    the copies of their traces, so the child runs untracked."""
    for block in install.live_blocks():
        if isinstance(block, Recorder):
            # A fork's child must start whatever happens here.
            with contextlib.suppress(BaseException):
                block.abandon()
    stacks.purge_ended_modes(RecorderMode)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_untrack_forked_child)


_LOCALS_MESSAGE = (
    "This Python version's function locals cannot be read without changing them: tensors held "
    "only by local variables are not named."
)


def _holder_reader(recorder_ref: weakref.ref[Recorder]) -> Callable[[], None]:
    """What the trace calls when the user reads `retained_bytes` inside the block: a read of who
    holds saved memory, on the block's thread and outside the recorder's own code (the code may
    have dropped a tensor since the last read: no event says so). Weak: the trace never keeps
    the recorder."""

    def read() -> None:
        recorder = recorder_ref()
        if recorder is None or recorder._busy or threading.get_ident() != recorder._thread:
            return
        recorder.read_holders()

    return read
