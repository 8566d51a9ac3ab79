"""`EventWriting`: the writer's most frequent events (the common op's new node, a node's death, a
saved buffer's release, a timeline sample and its flush), in Python.

This is the reference and the fallback: where the compiled recorder is in use its writer's base is
`_native.EventWriter` (autograd_magic/_events.c), which does the same without a Python frame and is
reached from a node tag's or packed buffer's death directly. tests/test_native.py checks both write
the same `Trace`. Called on the per-op path, so written for speed (locals, no helpers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autograd_magic.model.records import (
    UNKNOWN_SITE,
    BackwardCall,
    HeldBy,
    NodeRecord,
    SavedBuffer,
    Site,
    TimelineSample,
)
from autograd_magic.model.trace import Trace

NODES_CREATED = "nodes created"
NODE_FREED = "node freed"
_SAMPLE = TimelineSample
_new_sample = tuple.__new__  # the NamedTuple's own __new__ is a Python function (per event)


class EventWriting:
    """Mixin of the pure-Python `TraceWriter`: the per-event methods (state set by its
    `__init__`; the compiled twin keeps the same state in C fields of the same names)."""

    trace: Trace
    closed: bool
    untrack: Callable[[object], object] | None
    locate: Callable[[int], Site] | None
    active_backward: BackwardCall | None
    live_buffers: int
    _nodes: dict[int, NodeRecord]
    _buffers: dict[int, SavedBuffer]
    _storage_counts: dict[int, int]
    _storage_bytes: dict[int, int]
    held_by: dict[int, HeldBy]
    new_storages: dict[int, int]
    _run_open: bool
    _run_seq: int
    _run_live: int
    _run_bytes: int
    _last_what: str | None
    _last_line: int | None
    _timeline_stride: int
    module: str | None
    next_node_id: int
    new_tag: Callable[[Any, int], Any] | None
    tag_ref: Any
    _thin_timeline: Callable[[], None]

    def born_alone(self, node: Any, metadata: dict, key: str, site: Site | None) -> int | None:
        """The common op's node, recorded if it is new and every input's node has a tag (then
        it is tagged, and its id returned); None where a graph walk must find it (see
        `NodeRecording._discover`). `site`: the op's, when a saved buffer already found it."""
        next_ids = []
        for child, _ in node.next_functions:
            if child is not None:
                tag = child.metadata.get(key)
                if tag is None:
                    return None
                next_ids.append(tag[1])
        node_id = self.next_node_id
        self.next_node_id = node_id + 1
        metadata[key] = self.new_tag(self.tag_ref, node_id)  # type: ignore[misc]
        if site is None:
            locate = self.locate
            site = UNKNOWN_SITE if locate is None else locate(3)
        self.op_node(node_id, type(node).__name__, site, tuple(next_ids))
        return node_id

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
            self._run_bytes = trace.retained_bytes
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
            site = UNKNOWN_SITE if locate is None else locate(2)
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
            self._run_bytes = trace.retained_bytes
            self._run_open = True
        else:
            self.sample(NODE_FREED, site)

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
            site = UNKNOWN_SITE if locate is None else locate(2)
        trace = self.trace
        counts = self._storage_counts
        count = counts.get(storage_key)
        if count == 1:
            del counts[storage_key]
            nbytes = self._storage_bytes.pop(storage_key)
            self.new_storages.pop(storage_key, None)
            if self.held_by.pop(storage_key, None) is None:
                trace.retained_bytes -= nbytes
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
            self._run_bytes = trace.retained_bytes
            self._run_open = True
            return
        if not force and trace.seq % self._timeline_stride:
            return
        if self._run_open:
            self.flush()
        timeline = trace.timeline
        sample = _new_sample(
            _SAMPLE, (trace.seq, trace.live_nodes, trace.retained_bytes, what, line)
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
