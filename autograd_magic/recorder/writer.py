"""`TraceWriter`: the one place that changes a `Trace` and its records while a block records.

Folds events into counters and records, enforces the record caps, keeps the timeline bounded
(`samples`), writes what is known when the block ends (`end_state`), and freezes the trace when
the block ends: deaths after that are not the block's. The rest of the recorder asks it to change
a record; none writes one itself. Called on the per-op path, so the event methods are written for
speed (locals, no helpers).
"""

from __future__ import annotations

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
    VersionBump,
)
from autograd_magic.model.timeline import correct_retained, delta_at
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import describe_error
from autograd_magic.recorder import native
from autograd_magic.recorder.end_state import EndState
from autograd_magic.recorder.samples import TimelineWriter

NODES_CREATED = "nodes created"
NODE_FREED = "node freed"


def _unknown_site() -> Site:
    return UNKNOWN_SITE


class TraceWriter:
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
        # Where an event happened when it carries no site (a node dying, a buffer released):
        # the running backward call's line, else `locate()`, the line that let go.
        self.locate = _unknown_site if locate is None else locate
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
        self.timeline = TimelineWriter(trace, self.untrack)
        self.sample = self.timeline.sample
        self.flush = self.timeline.flush
        # What is written once the block ends (names, holders, module paths, its error).
        self.end = EndState(trace, self.module_calls, self.module_types)

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
        self,
        node_id: int,
        name: str,
        site: Site,
        existed_before: bool,
        next_ids: tuple[int, ...],
        alone: bool = False,
    ) -> None:
        """One node found by a graph walk (the caller takes the sequence number and sample), or,
        `alone`, the one node an op just made (the per-op path): then its sequence number and
        timeline sample are taken here, in the same call."""
        trace = self.trace
        if alone:
            trace.seq += 1
        trace.nodes_created += 1
        trace.live_nodes = live = trace.live_nodes + 1
        if live > trace.peak_live_nodes:
            trace.peak_live_nodes = live
        if len(trace.nodes) < trace.max_records:
            # Positional: a dataclass's __init__ takes keywords slower (one record per op).
            record = NodeRecord(
                node_id,
                name,
                trace.seq,
                site,
                next_ids,
                None,
                None,
                existed_before,
                None,
                self.module,
            )
            if self.untrack is not None:
                self.untrack(record)
            trace.nodes.append(record)
            self._nodes[node_id] = record
        else:
            trace.dropped_nodes += 1
        if alone:
            self.sample(NODES_CREATED, site)

    def node_died(self, node_id: int) -> None:
        """A tagged node was destroyed (called from its tag's finalizer)."""
        if self.closed:
            return
        call = self.active_backward
        site = self.locate() if call is None else call.site
        trace = self.trace
        trace.live_nodes -= 1
        trace.seq = seq = trace.seq + 1
        record = self._nodes.get(node_id)
        if record is not None:
            record.freed_seq = seq
            record.freed_site = site
        self.sample(NODE_FREED, site)

    # ----- saved buffers -------------------------------------------------------------------
    def buffer_packed(self) -> int:
        """A packed object now exists (its finalizer uncounts it: counted live at once); returns
        the sequence number of its saving."""
        self.live_buffers += 1
        trace = self.trace
        trace.seq = seq = trace.seq + 1
        return seq

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
        site = self.locate() if call is None else call.site
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

    def backward_reach(self, call: BackwardCall, index: int, root_ids: list[int]) -> list[int]:
        """Walk the recorded graph the `index`-th backward call of the block is about to traverse
        from `root_ids` (records only, no nodes), mark the nodes it reaches first and count what
        it reaches; returns the reached node ids."""
        call.root_ids = tuple(root_ids)
        previous = self.previous_backward_seq
        seen, stack = set(root_ids), list(root_ids)
        while stack:
            record = self._nodes.get(stack.pop())
            if record is None:
                continue
            if record.reached_by is None:
                record.reached_by = index
            if record.born_seq < previous and not record.existed_before:
                call.earlier_nodes += 1
            for child in record.next_ids:
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        call.graph_nodes = len(seen)
        if call.retain_graph:
            call.reached = tuple(seen)
        return list(seen)

    def backward_failed(self, call: BackwardCall, error: BaseException, reached: list[int]) -> None:
        """The backward call raised `error` after reaching those nodes."""
        call.error = describe_error(error)
        call.error_type = type(error).__name__
        call.reached = tuple(reached)

    # ----- modules -------------------------------------------------------------------------
    def module_entered(self, path: str) -> None:
        """A call of the module at `path` began: what happens until it returns is in it."""
        self.module = path
        calls = self.module_calls
        calls[path] = calls.get(path, 0) + 1

    def module_left(self, innermost: str | None) -> None:
        """A module call returned: `innermost` is the call still running (None: none)."""
        self.module = innermost

    def module_type(self, path: str, type_name: str) -> None:
        """The class of the module at `path` (also of containers never called)."""
        self.module_types.setdefault(path, type_name)

    # ----- the end -------------------------------------------------------------------------
    def stop(self) -> None:
        """Write nothing more: later deaths are not the block's (its trace may stay unfinished)."""
        self.closed = True

    def close(self) -> None:
        """End the block: the timeline is complete, and nothing written later (a node dying in
        the next cell) changes this trace."""
        self.flush()
        self.trace.finished = True
        self.closed = True
        self.active_backward = None
