"""`watch()`: leave it on. Every step is counted for what the hooks alone cost; the steps that
explain a problem are captured in full (the first steps, a schedule, on demand, or when the
counters show graphs piling up); an out-of-memory error gets a post-mortem.

A step ends with each backward call (or `w.step()`, once the code calls it). A counted step
keeps a few numbers (`StepCounts`); a captured step runs today's recorder (`track()`), entered at
a step boundary and left at a later one: a run of captured steps is one `CaptureWindow` with its
own `Trace`, findings included. See `WatchTrace` for what a watched block leaves.
"""

from __future__ import annotations

import bisect
import os
import sys
import time
from collections import deque
from collections.abc import Collection
from types import CodeType, FrameType, TracebackType
from typing import Any

import torch

from autograd_magic.model.watch import (
    MAX_PERIOD,
    MODULE_CHECK_STEPS,
    MODULE_WARM_STEPS,
    PILE_STEPS,
    CaptureWindow,
    HeldSaved,
    OutOfMemory,
    StepCounts,
    WatchOptions,
    captured_counts,
    growth_start,
    is_out_of_memory,
    module_hooks_too_costly,
    repeat_period,
)
from autograd_magic.recorder import module_calls, stacks, torch_api
from autograd_magic.recorder.core import Recorder
from autograd_magic.recorder.counting import StepCounter
from autograd_magic.recorder.frames import outside_caller
from autograd_magic.recorder.mode import RecorderMode
from autograd_magic.recorder.naming import frame_namespace
from autograd_magic.recorder.sites import user_frame
from autograd_magic.trace import Trace
from autograd_magic.watch_trace import WatchTrace

__all__ = ["Watch", "WatchOptions", "WatchTrace", "watch"]


def watch(
    save: str | os.PathLike[str] | None = None,
    first: int = WatchOptions.first,
    every: int = WatchOptions.every,
    escalate_after: int = WatchOptions.escalate_after,
    capture_steps: int = WatchOptions.capture_steps,
    max_windows: int = WatchOptions.max_windows,
    **track_options: Any,
) -> Watch:
    """Watch a block: `with autograd_magic.watch() as w:` counts every step and captures some in
    full. `first`: steps captured at the start; `every`: also capture every Nth step (0: never);
    escalation: when live backward roots or retained saved bytes rise at `escalate_after`
    consecutive step ends, the next `capture_steps` steps are captured (at most `max_windows`
    windows). `save="watch.json"` writes the result when the block ends (`{rank}`, `{pid}`).
    Other options are `track()`'s (`namespace`, `home_code`, `ignore_names`, ...)."""
    options = WatchOptions(first, every, escalate_after, capture_steps, max_windows)
    return Watch(options, save=save, **track_options)


class Watch:
    """Context manager behind `watch()`; `__enter__` returns it (`w.step()`, `w.capture()`,
    `w.result`, the `WatchTrace` being filled)."""

    def __init__(
        self,
        options: WatchOptions | None = None,
        save: str | os.PathLike[str] | None = None,
        home_code: CodeType | None = None,
        namespace: dict[str, Any] | None = None,
        ignore_names: Collection[str] = (),
        **track_options: Any,
    ) -> None:
        self.options = options or WatchOptions()
        self.result = WatchTrace(self.options)
        self._save = save
        self._home_code = home_code
        self._namespace = namespace
        self._ignore_names = ignore_names
        self._track_options = track_options
        self._counter: StepCounter | None = None
        # The block's own frame, running while the block runs (dropped at exit): its line is
        # what a counted step's saved tensors are attributed to.
        self._frame: FrameType | None = None
        self._recorder: Recorder | None = None
        self._window: CaptureWindow | None = None
        self._explicit = False  # set by the first `step()`: then only `step()` ends steps
        self._since_step = 0  # backward calls since the last step end
        self._asked = 0  # steps `capture()` asked for, taken at the next step boundary
        self._purge_hook: Any = None  # while a closed window's mode may still be stacked
        self._escalated = False  # the current rise was captured: not again until it stops
        self._first: Recorder | None = None  # the first window's, made before the block
        self._whole = False  # set at the end: the first window was open from start to end
        self._step_end_seq = 0  # the window trace's sequence number at the last step end
        # Counted steps timed for the module-attribution check, the warm-up steps before them,
        # and the module calls before them.
        self._step_times: list[float] = []
        self._warm = 0
        self._calls_before = 0
        self._last_end = 0.0  # thread_time() at the last step end (0: none yet)
        # The lines that called the last steps' backward calls (in the user's code, which may
        # be a function the block calls), and the backward calls per loop iteration they show
        # (see `repeat_period`; 1 once `step()` marks the steps): growth is read across
        # iterations, not within one.
        self._lines: deque[tuple[CodeType | None, int]] = deque(maxlen=2 * MAX_PERIOD)
        self._period = 1
        # A module pre-hook that opens a window at the next module call, once saved tensors
        # piled up with no backward call (see `_on_pile`).
        self._pile_hook: Any = None
        # Told at counted step ends (see `listen_steps`), at most once per `_listen_every` s.
        self._step_listener: Any = None
        self._listen_every = 1.0
        self._next_call = 0.0

    # ----- the block ----------------------------------------------------------------------
    def __enter__(self) -> Watch:
        frame = None
        if self._home_code is None:
            frame = self._frame = outside_caller()
            self._home_code = frame.f_code
        # With `home_code` given (the magic, the command line) the block's frame does not exist
        # yet: it is found at the first step's end (`_find_frame`).
        self._counter = StepCounter(block_frame=frame, on_backward_end=self._backward_ended)
        self._counter.install()
        if self.options.first > 0:
            self._open_window(self.options.first, "the first steps", self.first_recorder)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        __tracebackhide__ = True
        windows = self.result.windows
        self._whole = (
            len(windows) == 1 and self._window is windows[0] and windows[0].first_step == 1
        )
        try:
            if error is not None and is_out_of_memory(error) and self._counter is not None:
                self.result.out_of_memory = self._post_mortem(error)
            self._close_window(kind, error, tb)
        finally:
            self._frame = None
            if self._counter is not None:
                self._counter.block_frame = None
            self._purge()
            self._stop_purging()
            self._stop_pile_hook()
            if self._counter is not None:
                self._counter.remove()
            self.result.finish(None if error is None else f"{type(error).__name__}: {error}")
            if self._save is not None:
                from autograd_magic.saving import save_trace

                save_trace(self.result, self._save)

    @property
    def trace(self) -> Trace | WatchTrace:
        """What the block leaves: the first window's `Trace` when that window recorded the whole
        block (as `track()` would have), else the `WatchTrace`."""
        if self._whole:
            return self.result.windows[0].trace
        return self.result

    def listen(self, callback: Any, interval_s: float = 1.0) -> None:
        """Have `callback(trace)` called while the first window records (a live panel of the
        first steps); counted steps call no listener."""
        first = self.first_recorder
        if first is not None:
            first.listen(callback, interval_s)

    def listen_steps(self, callback: Any, interval_s: float = 1.0) -> None:
        """Have `callback(result)` called at counted step ends, at most once per `interval_s`
        seconds (a live panel's progress between captures); an exception in it unregisters it."""
        self._step_listener = callback
        self._listen_every = interval_s
        self._next_call = 0.0

    def _tell_listener(self) -> None:
        now = time.monotonic()
        if now < self._next_call:
            return
        self._next_call = now + self._listen_every
        try:
            self._step_listener(self.result)
        except Exception:
            self._step_listener = None

    # ----- steps --------------------------------------------------------------------------
    def step(self) -> None:
        """End a step here (from the first call on, backward calls no longer end steps)."""
        if self._purge_hook is not None:
            self._purge()
        if not self._explicit and not self._since_step and self.result.steps_done:
            # Right after a backward call ended a step: the code marks its own from now on.
            self._explicit = True
            return
        self._explicit = True
        self._end_step()

    def capture(self, steps: int = WatchOptions.capture_steps) -> None:
        """Capture the next `steps` steps in full, from the next step boundary."""
        self._asked = max(self._asked, steps)

    def _backward_ended(self) -> None:
        self._since_step += 1
        if not self._explicit:
            self._end_step()

    def _end_step(self) -> None:
        counter = self._counter
        if counter is None:
            return
        if self._frame is None:
            self._find_frame(counter)
        self._since_step = 0
        window, result = self._window, self.result
        step = result.steps_done + 1
        if not self._explicit:
            self._note_line()
        if window is None:  # a counted step: its row goes in as it is, no object made
            counter.end_counted_step(result.steps, step)
            result.step_added(step)
            if len(self._step_times) < MODULE_CHECK_STEPS:
                self._check_module_cost(counter, True)
            self._maybe_open(step)
            self._watch_pile(counter)
            if self._step_listener is not None:
                self._tell_listener()
            return
        counts = _captured(counter.end_step(step=step), self._recorder, self._step_end_seq)
        self._step_end_seq = window.trace.seq
        # What a captured step saved (its record's peak above the step before's end) sizes the
        # pile limit too: a loop whose steps were all captured still has one after its window.
        before = result.steps[-1].retained_bytes if len(result.steps) else 0
        counter.step_bytes = max(counter.step_bytes, counts.peak_bytes - before)
        result.add_step(counts)
        self._check_module_cost(counter, False)
        window.last_step = step
        if step - window.first_step + 1 >= window.planned_steps:
            self._close_window(None, None, None)
            self._watch_pile(counter)

    def _watch_pile(self, counter: StepCounter) -> None:
        """Between windows, have the pack hook call `_on_pile` if saved tensors pile up."""
        if self._window is None and len(self.result.windows) < self.options.max_windows:
            counter.watch_pile(PILE_STEPS, self._on_pile)

    def _on_pile(self) -> None:
        """Called from the pack hook: live saved bytes passed what the last step end left plus
        `PILE_STEPS` steps' worth, with no backward call since (outputs kept with their graphs
        after training, a validation loop without no_grad). A window opens at the next module
        call, where no torch op is running."""
        if self._window is None and self._pile_hook is None:
            self._pile_hook = module_calls.add_unseen_pre_hook(self._open_piled)

    def _open_piled(self, *args: Any) -> None:
        self._stop_pile_hook()
        if self._window is not None or len(self.result.windows) >= self.options.max_windows:
            return
        self._open_window(
            self.options.capture_steps,
            f"saved tensors piled up with no backward call to free them (more than "
            f"{PILE_STEPS} times what a step saved)",
        )

    @property
    def _growth_period(self) -> int:
        """Steps per loop iteration for the growth check (1 once `step()` marks the steps)."""
        return 1 if self._explicit else self._period

    def _stop_pile_hook(self) -> None:
        hook, self._pile_hook = self._pile_hook, None
        if hook is not None:
            module_calls.remove_unseen(hook)

    def _note_line(self) -> None:
        """Note the line that called this step's backward, and the loop's period."""
        lines = self._lines
        line = _backward_site(sys._getframe(2))
        period = self._period
        known = len(lines) >= period and lines[-period] == line
        lines.append(line)
        if not known:  # the pattern changed (or is still being learnt)
            self._period = repeat_period(lines)

    def _check_module_cost(self, counter: StepCounter, counted: bool) -> None:
        """Time counted steps (after the first few, which run colder); stop module attribution
        where it is not cheap, judged on their median."""
        times = self._step_times
        if len(times) >= MODULE_CHECK_STEPS:
            return  # decided (a clock read costs a system call: none after that)
        # This thread's CPU time: on a shared machine, wall time also counts other jobs' turns.
        now, last = time.thread_time(), self._last_end
        self._last_end = now
        if not counted or not last:  # a captured step, or none before: start again from here
            times.clear()
            self._warm = 0
            return
        self._warm += 1
        if self._warm <= MODULE_WARM_STEPS:
            self._calls_before = counter.module_calls
            return
        times.append(now - last)
        if len(times) == MODULE_CHECK_STEPS:
            calls = (counter.module_calls - self._calls_before) // MODULE_CHECK_STEPS
            why = module_hooks_too_costly(calls, sorted(times)[MODULE_CHECK_STEPS // 2])
            if why:
                counter.stop_modules()
                self.result.modules_off = f"from step {self.result.steps_done + 1:,}: {why}"

    def _find_frame(self, counter: StepCounter) -> None:
        """The running frame of the watched code, once it runs (`home_code` given)."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code is not self._home_code:
            frame = frame.f_back
        if frame is not None:
            self._frame = counter.block_frame = frame

    def _maybe_open(self, step: int) -> None:
        """Open a window at this step boundary when asked, scheduled, or when graphs pile up."""
        options, result = self.options, self.result
        if self._asked:
            steps, self._asked = self._asked, 0
            self._open_window(steps, "asked for with capture()")
            return
        rise = growth_start(result.steps, options.escalate_after, self._growth_period)
        if rise is None:
            self._escalated = False
            if not options.every:
                return
        if len(result.windows) >= options.max_windows:
            return
        if rise is not None and not self._escalated:
            self._escalated = True
            what, since = rise
            self._open_window(options.capture_steps, f"{what} grew from step {since}")
        elif options.every and (step + 1) % options.every == 0:
            self._open_window(1, f"every {options.every} steps")

    # ----- capture windows ----------------------------------------------------------------
    @property
    def first_recorder(self) -> Recorder | None:
        """The recorder of the first window (the `first` steps), before the block enters it: a
        live panel can listen to it. None when nothing is captured from the start or the
        watched code is not known yet (`home_code` not given: known at `__enter__`)."""
        if self._first is None and self.options.first > 0 and self._home_code is not None:
            self._first = self._new_recorder()
        return self._first

    def _new_recorder(self) -> Recorder:
        return Recorder(
            trace=Trace(),
            home_code=self._home_code,
            namespace=self._namespace,
            ignore_names=self._ignore_names,
            **self._track_options,
        )

    def _open_window(self, steps: int, reason: str, recorder: Recorder | None = None) -> None:
        first = self.result.steps_done + 1
        recorder = recorder or self._new_recorder()
        recorder.__enter__()
        self._recorder = recorder
        self._step_end_seq = 0
        self._window = CaptureWindow(first, first - 1, steps, reason, recorder.trace)
        self.result.windows.append(self._window)

    @property
    def all_captured(self) -> bool:
        """True when one window recorded the whole block, from its start to its end (no step
        was only counted): its `Trace` is then the block's full record, as `track()` gives."""
        return self._whole

    def _close_window(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        recorder, self._recorder, self._window = self._recorder, None, None
        growth = growth_start(self.result.steps, self.options.escalate_after, self._growth_period)
        if growth is not None:
            self._escalated = True  # this window saw the rise: not captured again until it stops
        if recorder is not None:
            if self._namespace is None and self._frame is not None:
                # Closed inside a backward call, the recorder would look for the user's names
                # in torch's frame: it gets the watched block's own.
                recorder.state.namespace = block_namespace(self._frame)
            # The recorder records the error that ended its block; it never swallows it.
            recorder.__exit__(kind, error, tb)
            # Closed at a step end, inside the backward call its mode is dispatching: torch puts
            # the (now pass-through) mode back when that call returns. It is taken out at the
            # next moment no torch call is running (a top-level module call, `step()`, the end).
            self._purge_soon()

    def _purge_soon(self) -> None:
        if self._purge_hook is None:
            self._purge_hook = module_calls.add_unseen_pre_hook(self._purge)

    def _purge(self, *args: Any) -> None:
        stacks.purge_ended_modes(RecorderMode)
        if not any(type(m) is RecorderMode for m in torch_api.function_mode_stack()):
            self._stop_purging()

    def _stop_purging(self) -> None:
        hook, self._purge_hook = self._purge_hook, None
        if hook is not None:
            module_calls.remove_unseen(hook)

    def _post_mortem(self, error: BaseException) -> OutOfMemory:
        """What autograd held when memory ran out: saved bytes by line and by module, live
        backward roots, the last steps' counters."""
        counter = self._counter
        assert counter is not None
        held = list(counter.held_now())
        for window in self.result.windows:  # what the recorder packed in its windows
            held += held_in(window.trace)
        frame = self._frame
        return OutOfMemory.of(
            error=f"{type(error).__name__}: {error}",
            held=held,
            live_roots=counter.live_roots,
            last_steps=tuple(self.result.steps[-5:]),
            step=self.result.steps_done + 1,
            modules_off=self.result.modules_off,
            holders=graph_holders(self._namespace)
            if self._namespace is not None
            else ()
            if frame is None
            else graph_holders(block_namespace(frame)),
        )


def _backward_site(frame: FrameType | None) -> tuple[CodeType | None, int]:
    """The code and line of the user's frame from `frame` outwards (`sites.user_frame`): where
    the user's code called the backward."""
    user = user_frame(frame)
    return (None, 0) if user is None else (user.f_code, user.f_lineno)


def _captured(counts: StepCounts, recorder: Recorder | None, since_seq: int) -> StepCounts:
    """A captured step's counts: the recorder's hooks were innermost, so its trace has the
    saved bytes the counter did not see: retained now, and the most within the step (its
    timeline samples after `since_seq`, the previous step's end)."""
    if recorder is None:
        return counts
    trace = recorder.trace
    retained = trace.retained_bytes
    samples = trace.timeline  # in sequence order: this step's are the tail
    start = bisect.bisect_right(samples, since_seq, key=lambda sample: sample.seq)
    peak = max((s.retained_bytes for s in samples[start:]), default=0)
    return captured_counts(counts, retained, max(peak, retained))


def block_namespace(frame: FrameType) -> dict[str, Any]:
    """The names the watched block sees, read without changing the frame (see naming)."""
    namespace = frame_namespace(frame)
    return dict(frame.f_globals) if namespace is None else namespace


def held_in(trace: Trace) -> list[HeldSaved]:
    """The saved tensors a window's trace still holds, as the counter reports its own."""
    return [
        HeldSaved(b.nbytes, b.shape, b.dtype, b.saved_line, b.module or "", b.held_by)
        for b in trace.buffers
        if not b.freed
    ]


def graph_holders(namespace: dict[str, Any], limit: int = 20) -> tuple[str, ...]:
    """Names in `namespace` holding a tensor with a graph, directly or in a list, tuple or
    dict (`losses[...]`): who keeps graphs alive, read without touching any graph."""

    def has_graph(value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.grad_fn is not None

    names = []
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        if has_graph(value):
            names.append(name)
            continue
        items = list(value.values()) if isinstance(value, dict) else value
        if isinstance(items, (list, tuple)) and any(has_graph(v) for v in items[-64:]):
            names.append(f"{name}[...]")
        if len(names) >= limit:
            break
    return tuple(names)
