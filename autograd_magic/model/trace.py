"""`Trace`: the records of one tracked block plus its counters (live nodes, retained bytes).

Read-only data for everyone but the recorder's `TraceWriter`, which fills it while the block runs
and freezes it when the block ends. Holds no reference to user tensors, arrays or nodes: only
records and integers. Nothing derived and no words: the analysis (`autograd_magic.analysis`)
reads it, and `autograd_magic.trace.Trace` adds the reading API users call (`findings`,
`modules()`, `storage_groups()`, `graph()`). `Trace.from_records` builds one from records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from autograd_magic.model.records import (
    AliasLink,
    BackwardCall,
    Blindspot,
    Finding,
    Holder,
    NodeRecord,
    SavedBuffer,
    Site,
    Snapshot,
    TimelineSample,
    VersionBump,
)
from autograd_magic.model.units import object_label

DEFAULT_MAX_RECORDS = 100_000
DEFAULT_MAX_TIMELINE = 20_000
__all__ = ["DEFAULT_MAX_RECORDS", "DEFAULT_MAX_TIMELINE", "TimelineSample", "Trace"]


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
        self.timeline: list[TimelineSample] = []
        # What a loaded file stored: the analysis's facts (format 4, as plain JSON data the
        # analysis decodes) or, in files of formats 1-3, worded findings. None: not stored.
        self.stored_facts: list[Any] | None = None
        self.stored_findings: list[Finding] | None = None
        self.sources: dict[str, list[str]] = {}  # a loaded file's cited source lines, by file
        self.blindspots: list[Blindspot] = []
        self.holders: list[Holder] = []
        self.labels: dict[int, str] = {}
        # nn.Module path -> forward calls in the block, and its class name (see `modules()`).
        self.module_calls: dict[str, int] = {}
        self.module_types: dict[str, str] = {}
        self.object_kinds: dict[int, str] = {}
        # Ids of tracked tensors/arrays still alive when the block ended; while it runs, at the
        # live view's last refresh (None before any).
        self.alive_at_end: set[int] | None = None
        self.max_records = max_records
        self.max_timeline = max_timeline
        self.dropped_nodes = 0
        self.dropped_buffers = 0
        self.dropped_events = 0  # version bumps and alias links beyond `max_records`
        self.finished = False
        self.error: str | None = None
        self.error_site: Site | None = None
        # The traced code's file (the cell's, the script's): its functions' lines are its own.
        self.home_file: str | None = None
        self.seq = 0
        self.live_nodes = 0
        # Retained bytes as the recorder last counted them; `retained_bytes` gives them exact.
        self.counted_retained_bytes = 0
        # Set by the recorder while its block runs: reads who holds saved memory, so that a
        # read of `retained_bytes` inside the block is exact (does nothing when nothing changed).
        self.read_holders: Callable[[], None] | None = None
        self.peak_live_nodes = 0
        self.peak_retained_bytes = 0
        self.nodes_created = 0
        self.buffers_saved = 0

    @classmethod
    def from_records(
        cls,
        nodes: Iterable[NodeRecord] = (),
        buffers: Iterable[SavedBuffer] = (),
        timeline: Iterable[TimelineSample] = (),
        **fields: object,
    ) -> Trace:
        """A finished-or-not trace made of the given records; `fields` sets any other attribute
        (`links`, `version_bumps`, `labels`, `live_nodes`, ...). Unknown names raise TypeError."""
        trace = cls()
        trace.nodes = list(nodes)
        trace.buffers = list(buffers)
        trace.timeline = list(timeline)
        for name, value in fields.items():
            if (
                name.startswith("_")
                or not hasattr(trace, name)
                or callable(getattr(cls, name, None))
            ):
                raise TypeError(f"Trace has no field {name!r}")
            setattr(trace, name, value)
        return trace

    # ----- reading -------------------------------------------------------------------------
    @property
    def retained_bytes(self) -> int:
        """Bytes only the graphs hold now (what their death would give back). Inside a block
        who holds each saved storage is read first, so the number is exact when it is read."""
        read = self.read_holders
        if read is not None:
            read()
        return self.counted_retained_bytes

    @retained_bytes.setter
    def retained_bytes(self, value: int) -> None:
        self.counted_retained_bytes = value

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

    def label(self, object_id: int) -> str:
        """The user's name for a tracked tensor or array, else its op label."""
        return object_label(self.labels, object_id)

    def buffers_of(self, node_id: int) -> list[SavedBuffer]:
        """The saved buffers a node owns."""
        return [b for b in self.buffers if b.node_id == node_id]

    def __repr__(self) -> str:
        s = self.snapshot()
        return (
            f"<Trace nodes={self.nodes_created} live={s.live_nodes} "
            f"retained={s.retained_bytes}B peak={s.peak_retained_bytes}B "
            f"backward_calls={len(self.backward_calls)}>"
        )
