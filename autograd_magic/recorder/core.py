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

from autograd_magic.model.records import Blindspot, BlindspotKind, Holder
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import describe_error
from autograd_magic.recorder import install, stacks, torch_api
from autograd_magic.recorder.aliases import AliasTracker
from autograd_magic.recorder.blind_spots import BlindSpots
from autograd_magic.recorder.caller import CallerStandIns
from autograd_magic.recorder.calls import OpRecording
from autograd_magic.recorder.deferred import take
from autograd_magic.recorder.frames import outside_caller
from autograd_magic.recorder.graph_holders import LiveHolders, has_graph, noting_holders
from autograd_magic.recorder.labels import resolve_labels
from autograd_magic.recorder.listening import Listening
from autograd_magic.recorder.mode import RecorderMode
from autograd_magic.recorder.module_calls import ModuleTracker
from autograd_magic.recorder.naming import frame_namespace
from autograd_magic.recorder.nodes import NodeFinder, current_sequence_nr
from autograd_magic.recorder.outside import HolderReader
from autograd_magic.recorder.packing import SavedTensorHooks
from autograd_magic.recorder.sites import SiteFinder, site_of_traceback
from autograd_magic.recorder.state import BlockState
from autograd_magic.recorder.tracebacks import strip_recorder_frames
from autograd_magic.recorder.writer import TraceWriter

# Tries to remove a block's recorder: an interrupt landing in removal gets another go; a
# removal that fails every time is reported, never retried for good (issue 31).
REMOVAL_TRIES = 5


_next_trace_number = 0


class Recorder:
    """Context manager behind `track()`; `__enter__` returns the `Trace` being filled.

    Made of parts that share one `BlockState`: the per-call path (`calls`), node discovery
    (`nodes`), the saved-tensor hooks (`packing`), aliases and writes (`aliases`), module calls,
    blind spots, the reads of who holds saved memory, and the live listener; the `TraceWriter`
    alone changes the trace."""

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
        sites = SiteFinder(home_code)
        self.writer = TraceWriter(self.trace, locate=sites.here)
        self.state = state = BlockState(
            self.trace,
            self.writer,
            f"autograd_magic:{_next_trace_number}",
            sites,
            namespace,
            frozenset(ignore_names),
        )
        self._on_exit = on_exit  # called with the finished trace; must not raise
        self._name_budget_s = name_budget_s
        self.aliases = AliasTracker(self.writer, sites)
        self.modules = ModuleTracker(self.writer)
        self.hooks = SavedTensorHooks(state, self.aliases)
        self.blind = BlindSpots(state, self.aliases, self)
        self.nodes = NodeFinder(state, self.blind.note, self.hooks.unpack)
        self.holders = HolderReader(state, self.aliases, self.modules, LiveHolders(state).read)
        self.listening = Listening(self.writer, self.holders.read_for_listener)
        self._stand_ins = CallerStandIns(namespace)
        self.calls = OpRecording(
            state, self.nodes, self.aliases, self.holders, self.listening, self._stand_ins
        )

    # ----- install / remove -------------------------------------------------------------
    def __enter__(self) -> Trace:
        state = self.state
        if state.sites.home_code is None:
            state.sites.home_code = outside_caller().f_code
        self.trace.home_file = state.sites.home_code.co_filename
        state.sequence_start = current_sequence_nr()
        state.thread = threading.get_ident()
        try:
            self._install()
        except BaseException:
            # Raised here (a KeyboardInterrupt included) `with` never calls __exit__.
            self._remove_all()
            raise
        self.trace.read_holders = _holder_reader(weakref.ref(self.holders))
        return self.trace

    def _install(self) -> None:
        stacks.purge_ended_modes(RecorderMode)
        stacks.purge_stranded()
        state = self.state
        state.pack, state.unpack = self.hooks.pack, self.hooks.unpack
        state.mode = RecorderMode(self.calls)
        disabled = install.hooks_disabled_message()
        if disabled is None:
            stacks.push_hooks(state.pack, state.unpack)
        stacks.push_mode_innermost(state.mode)
        install.add_patches(self.blind)
        self.modules.install()
        if disabled is not None:
            # Entered where PyTorch refuses saved-tensor hooks (inside a torch.func transform or
            # disable_saved_tensors_hooks): ours join when hooks are enabled again.
            kind: BlindspotKind = (
                "torch.func" if disabled.startswith("torch.func") else "hooks-disabled"
            )
            self.blind.note(kind, state.sites.here(), install.DISABLED_MESSAGES[kind])
            state.suspended = "hooks"
            install.suspended_until_enabled(self.blind)

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
        install.remove_patches(self.blind)
        self.modules.remove()

    def _remove_mode(self) -> None:
        # A block ended on another thread than it began (a generator resumed elsewhere) cannot
        # reach the first thread's stacks: its mode and hooks only pass calls and tensors on
        # until that thread removes them (stacks.strand).
        state = self.state
        if state.mode is not None and threading.get_ident() == state.thread:
            stacks.remove_mode(state.mode)

    def _remove_hooks(self) -> None:
        state = self.state
        if threading.get_ident() != state.thread:
            stacks.strand(state.thread, state.pack)
        elif state.pack is not None:
            stacks.remove_hooks(state.pack)

    def _forget_installed(self) -> None:
        """What is still installed only passes calls and tensors on (also when its removal
        failed); nothing points back at this recorder."""
        state = self.state
        if state.mode is not None:
            # Stashed by torch when interrupted, the mode may come back later: harmless then.
            state.mode.recorder = None
        # The mode and hooks point back at the block's parts: drop them so no cycle outlives
        # the block (users may run with gc disabled). The stand-ins hold callers' globals.
        state.mode = state.pack = state.unpack = None
        self._stand_ins.clear()

    def _removal_failed(self, error: BaseException) -> None:
        """Removal failed every try: say so once, leave what stayed passing calls on (the next
        block or `uninstall()` takes it out: ended modes and stranded hooks are purged)."""
        if self.state.pack is not None:
            stacks.strand(self.state.thread, self.state.pack)
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
        self.listening.listen(callback, interval_s)

    def began_on_this_thread(self) -> bool:
        """True when this block was entered on the calling thread."""
        return self.state.thread == threading.get_ident()

    def abandon(self) -> None:
        """Remove what this block installed without finishing its trace (`uninstall()`); an
        interrupt that arrived meanwhile is raised once all is removed."""
        interrupted = self._remove_all()
        self.aliases.release()
        self.writer.stop()
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
            self.holders.read_holders()  # the end state's retained bytes
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
        self.writer.stop()
        ended_by = exc if interrupted is None else interrupted
        if ended_by is not None:
            self.writer.end.error(
                f"{type(ended_by).__name__}: {describe_error(ended_by)}",
                site_of_traceback(tb, self.state.sites),
            )
        namespace = self.state.namespace
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
            self.state.namespace = None
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
        note_holder = noting_holders(self.state.key, holders)

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
            ignore=self.state.ignore_names,
        )
        root_names = {
            placeholder: name
            for i, placeholder in enumerate(roots)
            if (name := names.get(-1 - i)) is not None
        }
        self.writer.end.modules(root_names)
        self.writer.end.holders(holders)
        self.writer.close()


def uninstall_this_thread() -> int:
    """Remove every recorder still installed on this thread: running, left behind by an
    interrupt that landed as a block ended, or by a block that ended on another thread; returns
    how many. Their traces stay unfinished."""
    blocks = [b for b in _live_recorders() if b.began_on_this_thread()]
    for block in blocks:
        block.abandon()
    stacks.purge_ended_modes(RecorderMode)
    return len(blocks) + stacks.purge_stranded()


def _untrack_forked_child() -> None:
    """In a process forked while blocks ran (DataLoader workers, multiprocessing): nobody reads
    the copies of their traces, so the child runs untracked."""
    for block in _live_recorders():
        # A fork's child must start whatever happens here.
        with contextlib.suppress(BaseException):
            block.abandon()
    stacks.purge_ended_modes(RecorderMode)


def _live_recorders() -> list[Recorder]:
    """The recorders whose patches are still installed (running, or left by an interrupt)."""
    owners = [b.owner() for b in install.live_blocks() if isinstance(b, BlindSpots)]
    return [owner for owner in owners if isinstance(owner, Recorder)]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_untrack_forked_child)


_LOCALS_MESSAGE = (
    "This Python version's function locals cannot be read without changing them: tensors held "
    "only by local variables are not named."
)


def _holder_reader(holders_ref: weakref.ref[HolderReader]) -> Callable[[], None]:
    """What the trace calls when the user reads `retained_bytes` inside the block: a read of who
    holds saved memory, on the block's thread and outside the recorder's own code (the code may
    have dropped a tensor since the last read: no event says so). Weak: the trace never keeps
    the recorder."""

    def read() -> None:
        holders = holders_ref()
        if holders is None or holders.state.busy or threading.get_ident() != holders.state.thread:
            return
        holders.read_holders()

    return read
