"""`TraceWriter`: the one place that changes a `Trace` while a block records.

Folds events into counters and records, keeps the timeline bounded (runs of one event on one line
fold into one sample; above the cap the resolution halves), enforces the record caps, calls the
live listener, and freezes the trace when the block ends: deaths after that are not the block's.
Called on the per-op path, so the event methods are written for speed (locals, no helpers).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

from autograd_magic.model.records import (
    UNKNOWN_SITE,
    AliasLink,
    BackwardCall,
    Blindspot,
    HeldBy,
    NodeRecord,
    SavedBuffer,
    Site,
    TimelineSample,
    VersionBump,
)
from autograd_magic.model.timeline import correct_retained, delta_at
from autograd_magic.model.trace import Trace
from autograd_magic.recorder import native
from autograd_magic.recorder.end_state import EndStateWriting
from autograd_magic.recorder.listening import Listener, ListenerCalling

NODES_CREATED = "nodes created"
NODE_FREED = "node freed"
BACKWARD_MARKERS = ("backward start", "backward")
_SAMPLE = TimelineSample
_new_sample = tuple.__new__  # the NamedTuple's own __new__ is a Python function (per event)


class TraceWriter(EndStateWriting, ListenerCalling):
    """Writes one block's events into `trace`; `close()` ends the block for good."""

    def __init__(self, trace: Trace, locate: Callable[[], Site] | None = None) -> None:
        self.trace = trace
        self.closed = False
        # Records (and the recorder's packed buffers and weak references) are left out of the
        # cycle collector's scans where the compiled helper is there (`_native.untrack`: they
        # hold no cycle, and a block's many records would otherwise make each of the user's
        # collections walk them, and come sooner); the fallback keeps them tracked.
        self.untrack: Callable[[object], object] | None = (
            None if native.NATIVE is None else native.NATIVE.untrack
        )
        # Where an event happened when it carries no site (a node dying): `locate()`.
        self.locate = locate
        self.active_backward: BackwardCall | None = None
        # The innermost nn.Module being called (set by the module tracker), and per module path
        # its calls and class name.
        self.module: str | None = None
        self.module_calls: dict[str, int] = {}
        self.module_types: dict[str, str] = {}
        self.backward_count = 0
        self.previous_backward_seq = 0  # the sequence number of the call before the latest
        self._latest_backward_seq = 0
        # Packed objects autograd still holds (saved, not released): counted by the pack hook as
        # soon as one exists, since its finalizer uncounts it.
        self.live_buffers = 0
        self._nodes: dict[int, NodeRecord] = {}
        self._buffers: dict[int, SavedBuffer] = {}
        # Per storage key with live saved buffers: how many, its bytes, and (for keys not
        # counted as retained) who else holds it; plus keys first saved since the last read.
        # Plain dicts of ints: no object per storage for the cycle collector to scan.
        self._storage_counts: dict[int, int] = {}
        self._storage_bytes: dict[int, int] = {}
        self.held_by: dict[int, HeldBy] = {}
        self.new_storages: dict[int, int] = {}  # storage key -> sequence it was first saved at
        self.read_seq = 0  # the sequence number of the last read of holders (`reclassify`)
        self._peak_at_read = 0  # the peak as corrected at that read
        self._segment_peak_seq = 0  # when the uncorrected peak since that read was reached
        # A run of one event kind on one line is one timeline sample, its numbers kept as three
        # ints until the run ends: no allocation per op.
        self._run_open = False
        self._run_seq = self._run_live = self._run_bytes = 0
        self._last_what: str | None = None
        self._last_line: int | None = None
        self._timeline_stride = 1
        self._listened_at = time.monotonic()
        self._calls_to_clock = 0
        # Who wants to see the trace while it records (the live panel), and how often.
        self.listener: Listener | None = None
        self.listen_interval_s = 0.5
        # Asks who holds the storages saved so far (`reclassify`) before the listener reads.
        self.read_holders: weakref.WeakMethod[Callable[[], None]] | None = None

    # ----- lookups for the recorder -------------------------------------------------------
    def node_record(self, node_id: int) -> NodeRecord | None:
        """The record of a node written in this block (None beyond the cap)."""
        return self._nodes.get(node_id)

    def next_seq(self) -> int:
        """A new sequence number for an event."""
        trace = self.trace
        trace.seq += 1
        return trace.seq

    # ----- nodes --------------------------------------------------------------------------
    def node_born(
        self, node_id: int, name: str, site: Site, existed_before: bool, next_ids: tuple[int, ...]
    ) -> None:
        """One node found by a graph walk (the caller takes the sequence number and sample)."""
        trace = self.trace
        trace.nodes_created += 1
        trace.live_nodes += 1
        if trace.live_nodes > trace.peak_live_nodes:
            trace.peak_live_nodes = trace.live_nodes
        if len(trace.nodes) >= trace.max_records:
            trace.dropped_nodes += 1
            return
        record = NodeRecord(
            node_id,
            name,
            trace.seq,
            site,
            next_ids,
            existed_before=existed_before,
            module=self.module,
        )
        if self.untrack is not None:
            self.untrack(record)
        trace.nodes.append(record)
        self._nodes[node_id] = record

    def op_node(self, node_id: int, name: str, site: Site, next_ids: tuple[int, ...]) -> None:
        """The node an op just made (the per-op path): a new sequence number, the record and the
        timeline, in one call."""
        trace = self.trace
        trace.seq = seq = trace.seq + 1
        trace.nodes_created += 1
        trace.live_nodes = live = trace.live_nodes + 1
        if live > trace.peak_live_nodes:
            trace.peak_live_nodes = live
        if len(trace.nodes) < trace.max_records:
            record = NodeRecord(node_id, name, seq, site, next_ids, module=self.module)
            if self.untrack is not None:
                self.untrack(record)
            trace.nodes.append(record)
            self._nodes[node_id] = record
        else:
            trace.dropped_nodes += 1
        line = site.outer_line
        if line is None:
            line = site.line
        if line == self._last_line and self._last_what == NODES_CREATED:  # `sample`'s run, inline
            self._run_seq = seq
            self._run_live = live
            self._run_bytes = trace.counted_retained_bytes
            self._run_open = True
        else:
            self.sample(NODES_CREATED, site)

    def node_died(self, node_id: int) -> None:
        """A tagged node was destroyed (called from its tag's finalizer)."""
        if self.closed:
            return
        call = self.active_backward
        if call is not None:
            site = call.site
        else:
            locate = self.locate
            site = UNKNOWN_SITE if locate is None else locate()
        trace = self.trace
        trace.live_nodes = live = trace.live_nodes - 1
        trace.seq = seq = trace.seq + 1
        record = self._nodes.get(node_id)
        if record is not None:
            record.freed_seq = seq
            record.freed_site = site
        line = site.outer_line
        if line is None:
            line = site.line
        if line == self._last_line and self._last_what == NODE_FREED:
            self._run_seq = seq
            self._run_live = live
            self._run_bytes = trace.counted_retained_bytes
            self._run_open = True
        else:
            self.sample(NODE_FREED, site)

    # ----- saved buffers -------------------------------------------------------------------
    def buffer_saved(self, buffer: SavedBuffer, storage_key: int, held_by: HeldBy) -> None:
        """A tensor was saved for backward (its sequence number is already taken); `held_by`
        is who else surely holds it at saving ("" until a read says otherwise)."""
        trace = self.trace
        trace.buffers_saved += 1
        counts = self._storage_counts
        count = counts.get(storage_key)
        if count is None:
            counts[storage_key] = 1
            self._storage_bytes[storage_key] = buffer.storage_nbytes
            self.new_storages[storage_key] = trace.seq
            if held_by:
                self.held_by[storage_key] = held_by
            else:
                trace.counted_retained_bytes += buffer.storage_nbytes
                if trace.counted_retained_bytes > trace.peak_retained_bytes:
                    trace.peak_retained_bytes = trace.counted_retained_bytes
                    self._segment_peak_seq = trace.seq
        else:
            counts[storage_key] = count + 1
            held_by = self.held_by.get(storage_key, "")
        buffer.held_by = held_by
        if len(trace.buffers) >= trace.max_records:
            trace.dropped_buffers += 1
        else:
            buffer.module = self.module
            if self.untrack is not None:
                self.untrack(buffer)
            trace.buffers.append(buffer)
            self._buffers[buffer.id] = buffer
        self.sample("buffer saved", buffer.saved_site)

    def buffers_owned(self, buffer_ids: list[int], node_id: int) -> None:
        """These saved buffers belong to that node."""
        index = self._buffers
        for buffer_id in buffer_ids:
            record = index.get(buffer_id)
            if record is not None:
                record.node_id = node_id

    def buffer_released(self, buffer_id: int, storage_key: int) -> None:
        """Autograd let go of a saved buffer (called from the packed object's finalizer)."""
        if self.closed:
            return
        self.live_buffers -= 1
        call = self.active_backward
        if call is not None:
            site = call.site
        else:
            locate = self.locate
            site = UNKNOWN_SITE if locate is None else locate()
        trace = self.trace
        counts = self._storage_counts
        count = counts.get(storage_key)
        if count == 1:
            del counts[storage_key]
            nbytes = self._storage_bytes.pop(storage_key)
            self.new_storages.pop(storage_key, None)
            if self.held_by.pop(storage_key, None) is None:
                trace.counted_retained_bytes -= nbytes
                if call is not None:
                    call.released_bytes += nbytes
        elif count is not None:
            counts[storage_key] = count - 1
        trace.seq = seq = trace.seq + 1
        record = self._buffers.get(buffer_id)
        if record is not None:
            record.freed_seq = seq
            record.freed_site = site
        if call is not None:
            call.released_buffers += 1
        self.sample("buffer released", site)

    def reclassify(self, changes: dict[int, tuple[HeldBy, list[int]]]) -> None:
        """A read of who holds each storage: `changes` maps a storage key to its new holder and
        its live buffers' ids. Retained bytes, the buffers' records, the timeline and the peak
        follow; a storage first saved since the last read is taken to have had that holder
        since it was saved (its samples are corrected), an older one changes from now."""
        self.flush()
        trace = self.trace
        deltas: list[tuple[int, int]] = []
        for key, (held_by, buffer_ids) in changes.items():
            nbytes = self._storage_bytes.get(key)
            if nbytes is None:
                continue
            old = self.held_by.get(key, "")
            if held_by:
                self.held_by[key] = held_by
            else:
                self.held_by.pop(key, None)
            for buffer_id in buffer_ids:
                record = self._buffers.get(buffer_id)
                if record is not None:
                    record.held_by = held_by
            delta = (0 if held_by else nbytes) - (0 if old else nbytes)
            trace.counted_retained_bytes += delta
            first = self.new_storages.get(key)
            if delta and first is not None:
                deltas.append((first, delta))
        if deltas:
            peak = correct_retained(trace.timeline, deltas, self.read_seq)
            if self._segment_peak_seq > self.read_seq:  # the running peak was reached since
                peak = max(
                    peak, trace.peak_retained_bytes + delta_at(deltas, self._segment_peak_seq)
                )
        else:
            # No sample to correct: those since the last read are all under the running peak,
            # which rose only past the corrected one since.
            peak = trace.peak_retained_bytes
        peak = max(peak, trace.counted_retained_bytes)
        trace.peak_retained_bytes = self._peak_at_read = max(self._peak_at_read, peak)
        self.new_storages.clear()
        self.read_seq = trace.seq

    # ----- aliases, writes, names -----------------------------------------------------------
    def name(self, uid: int, op_label: str, kind: str | None = None) -> str:
        """The label of a tracked tensor/array, registering `op_label` the first time, and its
        kind ('tensor', 'ndarray') for storage members. Capped at `max_records` objects: beyond
        it an object keeps its op label in the records it appears in, and nothing more."""
        trace = self.trace
        labels = trace.labels
        label = labels.get(uid)
        if label is None:
            if len(labels) >= trace.max_records:
                return op_label
            label = labels[uid] = op_label
        if kind is not None:
            trace.object_kinds[uid] = kind
        return label

    def link(self, link: AliasLink) -> None:
        """An alias or copy link (counted, not kept, beyond the record cap)."""
        trace = self.trace
        if len(trace.links) < trace.max_records:
            if self.untrack is not None:
                self.untrack(link)
            trace.links.append(link)
        else:
            trace.dropped_events += 1

    def version_bump(self, bump: VersionBump, what: str | None) -> None:
        """An in-place write; `what` labels its timeline sample (None: no sample)."""
        trace = self.trace
        if len(trace.version_bumps) < trace.max_records:
            if self.untrack is not None:
                self.untrack(bump)
            trace.version_bumps.append(bump)
        else:
            trace.dropped_events += 1
        if what is not None:
            self.sample(what, bump.site)

    def blindspot(self, blindspot: Blindspot) -> None:
        """Something the recorder could not see."""
        self.trace.blindspots.append(blindspot)

    def add_backward_call(self, call: BackwardCall) -> int:
        """A backward/grad call was made (it runs after `backward_running`); returns its index
        among the block's calls. Beyond `max_records` calls it is counted, not kept."""
        trace = self.trace
        self.backward_count += 1
        self.previous_backward_seq, self._latest_backward_seq = self._latest_backward_seq, call.seq
        if len(trace.backward_calls) < trace.max_records:
            trace.backward_calls.append(call)
        else:
            trace.dropped_events += 1
        return self.backward_count - 1

    def backward_running(self, call: BackwardCall) -> None:
        """The engine starts: buffers and nodes released until it ends are attributed to it."""
        self.active_backward = call
        self.sample("backward start", call.site, force=True)

    def backward_ended(self, call: BackwardCall) -> None:
        """The backward call returned or raised."""
        self.active_backward = None
        call.end_seq = self.next_seq()
        self.sample("backward", call.site, force=True)

    # ----- timeline ------------------------------------------------------------------------
    def sample(self, what: str, site: Site, force: bool = False) -> None:
        """Record the state after an event; a run of the same event on one line folds into one
        sample. Backward markers (`force`) are always kept."""
        trace = self.trace
        # The traced code's own line (the cell line), also for events inside a user's forward.
        line = site.outer_line
        if line is None:
            line = site.line
        if not force and what == self._last_what and line == self._last_line:
            self._run_seq = trace.seq
            self._run_live = trace.live_nodes
            self._run_bytes = trace.counted_retained_bytes
            self._run_open = True
            return
        if not force and trace.seq % self._timeline_stride:
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
            self._thin_timeline()

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

    def _thin_timeline(self) -> None:
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
        self._timeline_stride *= 2
        last = timeline[-1] if timeline else None
        self._last_what = None if last is None else last.what
        self._last_line = None if last is None else last.line

    # ----- the end -------------------------------------------------------------------------
    def close(self) -> None:
        """End the block: the timeline is complete, and nothing written later (a node dying in
        the next cell) changes this trace."""
        self.flush()
        self.trace.finished = True
        self.closed = True
        self.active_backward = None
