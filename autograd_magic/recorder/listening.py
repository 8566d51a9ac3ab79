"""Calling the live listener (a panel) between two torch calls, at most once per interval, after
a read of who holds saved memory. Owned by the block's recorder, beside its writer: the writer
only writes, and never calls back into the recorder."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from autograd_magic.model.trace import Trace

if TYPE_CHECKING:
    from autograd_magic.recorder.writer import TraceWriter

# Called with the trace while it records (the live panel).
Listener = Callable[[Trace], None]


class Listening:
    """The block's listener and its clock."""

    def __init__(self, writer: TraceWriter, read: Callable[[], None]) -> None:
        self.writer = writer
        # Reads who holds the storages saved so far, and what is alive, before the listener
        # reads (`outside.HolderReader.read_for_listener`).
        self._read = read
        # Who wants to see the trace while it records (the live panel), and how often.
        self.listener: Listener | None = None
        self.interval_s = 0.5
        self._listened_at = time.monotonic()
        self._calls_to_clock = 0

    def listen(self, callback: Listener | None, interval_s: float = 0.5) -> None:
        """See `Recorder.listen` (never called inside a finalizer: `notify` runs between ops).
        The first call comes one interval after this, not after the recorder was made: a live
        panel built and shown meanwhile gets a whole interval before its first update."""
        self.listener = callback
        self.interval_s = interval_s
        self._listened_at = time.monotonic()

    def notify(self) -> None:
        """Call the listener if its interval has passed (checked every 32 calls)."""
        # Reading the clock on every torch call costs more than the view: look every 32 calls.
        self._calls_to_clock -= 1
        if self._calls_to_clock > 0:
            return
        interval = self.interval_s
        self._calls_to_clock = 32 if interval > 0 else 1
        if time.monotonic() - self._listened_at < interval:
            return
        listener = self.listener
        if listener is None:
            return
        writer = self.writer
        trace = writer.trace
        try:
            self._read()
            writer.flush()
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
