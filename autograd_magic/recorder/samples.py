"""The block's timeline, kept bounded: one sample per run of one event kind on one line (its
numbers kept as three ints until the run ends), and above the cap the resolution halves. Part of
the `TraceWriter`, which alone calls it."""

from __future__ import annotations

from collections.abc import Callable

from autograd_magic.model.records import Site, TimelineSample
from autograd_magic.model.trace import Trace

BACKWARD_MARKERS = ("backward start", "backward")
_SAMPLE = TimelineSample
_new_sample = tuple.__new__  # the NamedTuple's own __new__ is a Python function (per event)


class TimelineWriter:
    """Writes `trace.timeline`: a sample of the counters after each event, runs folded."""

    __slots__ = (
        "_last_line",
        "_last_what",
        "_run_bytes",
        "_run_live",
        "_run_open",
        "_run_seq",
        "_stride",
        "trace",
        "untrack",
    )

    def __init__(self, trace: Trace, untrack: Callable[[object], object] | None) -> None:
        self.trace = trace
        self.untrack = untrack
        self._run_open = False
        self._run_seq = self._run_live = self._run_bytes = 0
        self._last_what: str | None = None
        self._last_line: int | None = None
        self._stride = 1

    def sample(self, what: str, site: Site, force: bool = False) -> None:
        """Record the state after an event; a run of the same event on one line folds into one
        sample. Backward markers (`force`) are always kept."""
        trace = self.trace
        # The traced code's own line (the cell line), also for events inside a user's forward.
        line = site.outer_line
        if line is None:
            line = site.line
        if not force and line == self._last_line and what == self._last_what:
            self._run_seq = trace.seq
            self._run_live = trace.live_nodes
            self._run_bytes = trace.counted_retained_bytes
            self._run_open = True
            return
        if not force and trace.seq % self._stride:
            return
        if self._run_open:
            self.flush()
        timeline = trace.timeline
        sample = _new_sample(
            _SAMPLE, (trace.seq, trace.live_nodes, trace.counted_retained_bytes, what, line)
        )
        if self.untrack is not None:
            self.untrack(sample)
        timeline.append(sample)
        self._last_what, self._last_line = what, line
        if len(timeline) >= trace.max_timeline:
            self._thin()

    def flush(self) -> None:
        """Write the open run's numbers into its sample (before anyone reads the timeline)."""
        if self._run_open:
            timeline = self.trace.timeline
            last = timeline[-1]
            sample = _new_sample(
                _SAMPLE, (self._run_seq, self._run_live, self._run_bytes, last.what, last.line)
            )
            if self.untrack is not None:
                self.untrack(sample)
            timeline[-1] = sample
            self._run_open = False

    def _thin(self) -> None:
        """Halve the timeline's resolution (bounded memory, constant work per event): backward
        markers are all kept while they are at most half of it, then thinned like the rest."""
        self.flush()
        timeline = self.trace.timeline
        markers = sum(1 for s in timeline if s.what in BACKWARD_MARKERS)
        keep_markers = 2 * markers <= len(timeline)
        kept = [
            s
            for i, s in enumerate(timeline)
            if i % 2 == 0 or (keep_markers and s.what in BACKWARD_MARKERS)
        ]
        timeline[:] = kept
        self._stride *= 2
        last = timeline[-1] if timeline else None
        self._last_what = None if last is None else last.what
        self._last_line = None if last is None else last.line
