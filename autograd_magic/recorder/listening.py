"""Calling the live listener (a panel) between two torch calls, at most once per interval, after
a read of who holds saved memory (`TraceWriter` inherits it)."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

from autograd_magic.model.trace import Trace

# Called with the trace while it records (the live panel).
Listener = Callable[[Trace], None]


class ListenerCalling:
    """Mixin of `TraceWriter`: the listener and its clock (state set by its `__init__`)."""

    trace: Trace
    listener: Listener | None
    listen_interval_s: float
    read_holders: weakref.WeakMethod[Callable[[], None]] | None
    _listened_at: float
    _calls_to_clock: int

    flush: Callable[[], None]  # TraceWriter.flush

    def listen(self, callback: Listener | None, interval_s: float = 0.5) -> None:
        """See `Recorder.listen` (never called inside a finalizer: `notify` runs between ops).
        The first call comes one interval after this, not after the writer was made: a live
        panel built and shown meanwhile gets a whole interval before its first update."""
        self.listener = callback
        self.listen_interval_s = interval_s
        self._listened_at = time.monotonic()

    def notify(self) -> None:
        """Call the trace's listener if its interval has passed (checked every 32 calls)."""
        # Reading the clock on every torch call costs more than the view: look every 32 calls.
        self._calls_to_clock -= 1
        if self._calls_to_clock > 0:
            return
        trace = self.trace
        interval = self.listen_interval_s
        self._calls_to_clock = 32 if interval > 0 else 1
        if time.monotonic() - self._listened_at < interval:
            return
        listener = self.listener
        if listener is None:
            return
        try:
            read = None if self.read_holders is None else self.read_holders()
            if read is not None:
                read()
            self.flush()
            # Read just now: the view's own reads of `retained_bytes` need not read again.
            reader, trace.read_holders = trace.read_holders, None
            try:
                listener(trace)
            finally:
                trace.read_holders = reader
        except Exception:  # a broken view must not break the user's code
            self.listener = None
        # Counted from the end of this update, so updates are at least `interval` apart however
        # long one takes to send.
        self._listened_at = time.monotonic()
