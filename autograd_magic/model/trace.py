"""`Trace`: the records of one tracked block plus the folded counters (live nodes, retained bytes).

The recorder calls the `_on_*` methods as events happen; everything else only reads. The trace
holds no reference to user tensors, arrays or nodes: only records and integers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from autograd_magic.model.records import (
    UNKNOWN_SITE,
    AliasLink,
    BackwardCall,
    Blindspot,
    Finding,
    Holder,
    NodeRecord,
    SavedBuffer,
    Site,
    Snapshot,
    StorageGroup,
    VersionBump,
)

if TYPE_CHECKING:
    import networkx

DEFAULT_MAX_RECORDS = 100_000
DEFAULT_MAX_TIMELINE = 20_000
NODES_CREATED = "nodes created"
NODE_FREED = "node freed"


class TimelineSample(NamedTuple):
    """State right after an event: (sequence, live nodes, retained bytes, what happened, line)."""

    seq: int
    live_nodes: int
    retained_bytes: int
    what: str
    line: int


_SAMPLE = TimelineSample
_new_sample = tuple.__new__


class Trace:
    """Everything recorded while a `track()` block ran; usable during and after the block."""

    def __init__(
        self, max_records: int = DEFAULT_MAX_RECORDS, max_timeline: int = DEFAULT_MAX_TIMELINE
    ) -> None:
        self.nodes: list[NodeRecord] = []
        self.buffers: list[SavedBuffer] = []
        self.links: list[AliasLink] = []
        self.version_bumps: list[VersionBump] = []
        self.backward_calls: list[BackwardCall] = []
        self._timeline: list[TimelineSample] = []
        self._run_open = False
        self._run_seq = self._run_live = self._run_bytes = 0
        self._last_what: str | None = None
        self._last_line: int | None = None
        self.findings: list[Finding] = []
        self.blindspots: list[Blindspot] = []
        self.holders: list[Holder] = []
        self.labels: dict[int, str] = {}
        self.object_kinds: dict[int, str] = {}
        # Ids of tracked tensors/arrays still alive when the block ended (None while running).
        self.alive_at_end: set[int] | None = None
        self.max_records = max_records
        self.max_timeline = max_timeline
        self.dropped_nodes = 0
        self.dropped_buffers = 0
        self.dropped_events = 0  # version bumps and alias links beyond `max_records`
        self.finished = False
        self.error: str | None = None
        self.error_site: Site | None = None
        self.seq = 0
        self.live_nodes = 0
        self.retained_bytes = 0
        self.peak_live_nodes = 0
        self.peak_retained_bytes = 0
        self.nodes_created = 0
        self.buffers_saved = 0
        self._live_buffers = 0  # packed objects autograd still holds (saved, not released)
        self._node_index: dict[int, NodeRecord] = {}
        self._buffer_index: dict[int, SavedBuffer] = {}
        # Live non-leaf saved buffers per storage key, and that storage's bytes (two dicts of ints:
        # no object per storage for the cycle collector to scan).
        self._storage_counts: dict[int, int] = {}
        self._storage_bytes: dict[int, int] = {}
        self._timeline_stride = 1
        self._active_backward: BackwardCall | None = None
        self._locate: Callable[[int], Site] | None = None
        self._listener: Callable[[Trace], None] | None = None
        self._listen_interval = 0.0
        self._listened_at = 0.0
        self._calls_to_clock = 0
        self._clock_stride = 32

    # ----- reading -------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """Counters now and their peaks over the block."""
        return Snapshot(
            live_nodes=self.live_nodes,
            retained_bytes=self.retained_bytes,
            peak_live_nodes=self.peak_live_nodes,
            peak_retained_bytes=self.peak_retained_bytes,
            nodes_created=self.nodes_created,
            buffers_saved=self.buffers_saved,
        )

    def node(self, node_id: int) -> NodeRecord | None:
        """The record of a node by id (None when beyond the record cap)."""
        return self._node_index.get(node_id)

    def buffer(self, buffer_id: int) -> SavedBuffer | None:
        return self._buffer_index.get(buffer_id)

    def label(self, object_id: int) -> str:
        """The user's name for a tracked tensor or array, else its op label."""
        return self.labels.get(object_id, f"object#{object_id}")

    def buffers_of(self, node_id: int) -> list[SavedBuffer]:
        return [b for b in self.buffers if b.node_id == node_id]

    def storage_groups(self) -> list[StorageGroup]:
        """Groups of tensors/arrays that share memory, with how each joined and copies beside."""
        from autograd_magic.model.storage import storage_groups

        return storage_groups(self)

    def graph(self) -> networkx.DiGraph:
        """The recorded autograd graph; edges point from a node to its `next_functions`."""
        from autograd_magic.model.export import to_networkx

        return to_networkx(self)

    def to_json(self) -> str:
        """A complete, versioned JSON export (see `Trace.from_json`)."""
        from autograd_magic.model.export import trace_to_json

        return trace_to_json(self)

    @classmethod
    def from_json(cls, text: str) -> Trace:
        """Load an export without executing anything."""
        from autograd_magic.model.export import trace_from_json

        return trace_from_json(text)

    def __repr__(self) -> str:
        s = self.snapshot()
        return (
            f"<Trace nodes={self.nodes_created} live={s.live_nodes} "
            f"retained={s.retained_bytes}B peak={s.peak_retained_bytes}B "
            f"backward_calls={len(self.backward_calls)} findings={len(self.findings)}>"
        )

    def listen(self, callback: Callable[[Trace], None] | None, interval_s: float = 0.5) -> None:
        """Call `callback(trace)` while the block runs, at most once per `interval_s` seconds.

        It runs on the user's thread between two torch calls (never inside a finalizer); an
        exception in it unregisters it and is not propagated to user code.
        """
        self._listener = callback
        self._listen_interval = interval_s
        self._clock_stride = 32 if interval_s > 0 else 1
        self._listened_at = time.monotonic()

    def _notify(self) -> None:
        # Reading the clock on every torch call costs more than the view: look every 32 calls.
        self._calls_to_clock -= 1
        if self._calls_to_clock > 0:
            return
        self._calls_to_clock = self._clock_stride
        if time.monotonic() - self._listened_at < self._listen_interval:
            return
        listener = self._listener
        try:
            listener(self)
        except Exception:  # a broken view must not break the user's code
            self._listener = None
        # Counted from the end of this update, so updates are at least `interval` apart however
        # long one takes to send.
        self._listened_at = time.monotonic()

    # ----- folding events (called by the recorder) ---------------------------------------
    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _on_node_born(
        self, node_id: int, name: str, site: Site, existed_before: bool, next_ids: tuple[int, ...]
    ) -> None:
        self.nodes_created += 1
        self.live_nodes += 1
        if self.live_nodes > self.peak_live_nodes:
            self.peak_live_nodes = self.live_nodes
        if len(self.nodes) >= self.max_records:
            self.dropped_nodes += 1
            return
        record = NodeRecord(node_id, name, self.seq, site, next_ids, existed_before=existed_before)
        self.nodes.append(record)
        self._node_index[node_id] = record

    def _on_new_node(self, node_id: int, name: str, site: Site, next_ids: tuple[int, ...]) -> None:
        """The node an op just made (the per-op path): a new sequence number, the record, and
        the timeline. Same as `_next_seq`, `_on_node_born` and `_sample`, in one call."""
        self.seq = seq = self.seq + 1
        self.nodes_created += 1
        self.live_nodes = live = self.live_nodes + 1
        if live > self.peak_live_nodes:
            self.peak_live_nodes = live
        if len(self.nodes) < self.max_records:
            record = NodeRecord(node_id, name, seq, site, next_ids)
            self.nodes.append(record)
            self._node_index[node_id] = record
        else:
            self.dropped_nodes += 1
        line = site.outer_line
        if line is None:
            line = site.line
        if line == self._last_line and self._last_what == NODES_CREATED:
            self._run_seq = seq
            self._run_live = live
            self._run_bytes = self.retained_bytes
            self._run_open = True
        else:
            self._sample(NODES_CREATED, site)

    def _on_node_died(self, node_id: int) -> None:
        """A tagged node was destroyed (called from its tag's finalizer)."""
        call = self._active_backward
        if call is not None:
            site = call.site
        else:
            locate = self._locate
            site = UNKNOWN_SITE if locate is None else locate(2)
        self.live_nodes = live = self.live_nodes - 1
        self.seq = seq = self.seq + 1
        record = self._node_index.get(node_id)
        if record is not None:
            record.freed_seq = seq
            record.freed_site = site
        line = site.outer_line
        if line is None:
            line = site.line
        if line == self._last_line and self._last_what == NODE_FREED:  # `_sample`'s run, inline
            self._run_seq = seq
            self._run_live = live
            self._run_bytes = self.retained_bytes
            self._run_open = True
        else:
            self._sample(NODE_FREED, site)

    def _on_buffer_saved(self, buffer: SavedBuffer, storage_key: int) -> None:
        self.buffers_saved += 1
        if not buffer.is_leaf:
            counts = self._storage_counts
            count = counts.get(storage_key)
            if count is None:
                counts[storage_key] = 1
                self._storage_bytes[storage_key] = buffer.storage_nbytes
                self.retained_bytes += buffer.storage_nbytes
                if self.retained_bytes > self.peak_retained_bytes:
                    self.peak_retained_bytes = self.retained_bytes
            else:
                counts[storage_key] = count + 1
        if len(self.buffers) >= self.max_records:
            self.dropped_buffers += 1
            return
        self.buffers.append(buffer)
        self._buffer_index[buffer.id] = buffer

    def _on_buffer_owned(self, buffer_id: int, node_id: int) -> None:
        record = self._buffer_index.get(buffer_id)
        if record is not None:
            record.node_id = node_id

    def _on_buffers_owned(self, buffer_ids: list[int], node_id: int) -> None:
        index = self._buffer_index
        for buffer_id in buffer_ids:
            record = index.get(buffer_id)
            if record is not None:
                record.node_id = node_id

    def _on_buffer_released(self, buffer_id: int, is_leaf: bool, storage_key: int) -> None:
        """Autograd let go of a saved buffer (called from the packed object's finalizer)."""
        self._live_buffers -= 1
        call = self._active_backward
        if call is not None:
            site = call.site
        else:
            locate = self._locate
            site = UNKNOWN_SITE if locate is None else locate(2)
        if not is_leaf:
            counts = self._storage_counts
            count = counts.get(storage_key)
            if count == 1:
                del counts[storage_key]
                nbytes = self._storage_bytes.pop(storage_key)
                self.retained_bytes -= nbytes
                if call is not None:
                    call.released_bytes += nbytes
            elif count is not None:
                counts[storage_key] = count - 1
        self.seq = seq = self.seq + 1
        record = self._buffer_index.get(buffer_id)
        if record is not None:
            record.freed_seq = seq
            record.freed_site = site
        if call is not None:
            call.released_buffers += 1
        self._sample("buffer released", site)

    @property
    def timeline(self) -> list[TimelineSample]:
        """Samples of (sequence, live nodes, retained bytes, what happened, line)."""
        self._flush_run()
        return self._timeline

    @timeline.setter
    def timeline(self, samples: list[TimelineSample]) -> None:
        self._timeline = list(samples)
        self._run_open = False
        self._remember_last()

    def _flush_run(self) -> None:
        if self._run_open:
            last = self._timeline[-1]
            self._timeline[-1] = _new_sample(
                _SAMPLE, (self._run_seq, self._run_live, self._run_bytes, last.what, last.line)
            )
            self._run_open = False

    def _sample(self, what: str, site: Site, force: bool = False) -> None:
        """Record the state after an event; a run of the same event on one line folds into one
        sample (kept as three ints until the run ends: no allocation per op)."""
        # The traced code's own line (the cell line), also for events inside a user's forward.
        line = site.outer_line
        if line is None:
            line = site.line
        if not force and what == self._last_what and line == self._last_line:
            self._run_seq = self.seq
            self._run_live = self.live_nodes
            self._run_bytes = self.retained_bytes
            self._run_open = True
            return
        if not force and self.seq % self._timeline_stride:
            return
        if self._run_open:
            self._flush_run()
        timeline = self._timeline
        # tuple.__new__ directly: the NamedTuple's own __new__ is a Python function (per event).
        timeline.append(
            _new_sample(_SAMPLE, (self.seq, self.live_nodes, self.retained_bytes, what, line))
        )
        self._last_what, self._last_line = what, line
        if len(timeline) >= self.max_timeline:
            self._thin_timeline()

    def _thin_timeline(self) -> None:
        """Halve the timeline's resolution, keeping every backward marker (bounded memory)."""
        self._flush_run()
        kept = [s for i, s in enumerate(self._timeline) if i % 2 == 0 or "backward" in s.what]
        self._timeline[:] = kept
        self._timeline_stride *= 2
        self._remember_last()

    def _remember_last(self) -> None:
        """What and where the last sample was: the next event of the same kind there joins it."""
        last = self._timeline[-1] if self._timeline else None
        self._last_what = None if last is None else last.what
        self._last_line = None if last is None else last.line
