"""`BlockState`: what the parts of one block's recorder share, declared once.

Each part (`calls.OpRecording`, `nodes.NodeFinder`, `packing.SavedTensorHooks`,
`blind_spots.BlindSpots`, `outside.HolderReader`, `graph_holders.LiveHolders`) is built with the
block's state and holds it; none keeps a copy of a field that another part changes. Records are
changed by the writer alone (`writer.TraceWriter`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from types import CodeType
from typing import TYPE_CHECKING, Any

from autograd_magic.model.records import Site
from autograd_magic.model.trace import Trace

if TYPE_CHECKING:
    from autograd_magic.recorder.sites import SiteFinder
    from autograd_magic.recorder.writer import TraceWriter


class BlockState:
    """One block's shared state (slots: it is read on every torch call)."""

    __slots__ = (
        "busy",
        "call_site",
        "ignore_names",
        "in_call",
        "key",
        "mode",
        "namespace",
        "pack",
        "probe_hits",
        "sequence_start",
        "sites",
        "suspended",
        "thread",
        "trace",
        "unowned",
        "unpack",
        "writer",
        "writer_ref",
    )

    def __init__(
        self,
        trace: Trace,
        writer: TraceWriter,
        key: str,
        sites: SiteFinder,
        namespace: dict[str, Any] | None,
        ignore_names: frozenset[str],
    ) -> None:
        self.trace = trace
        self.writer = writer
        # Tags and packed buffers reach the writer weakly: they outlive the block in the graph.
        self.writer_ref = weakref.ref(writer)
        self.key = key  # this block's key in each node's `metadata`
        self.sites = sites
        # Where names are looked up (None: the namespace of the code running the block), and
        # the names there that are not the user's (the magic passes a notebook's own).
        self.namespace = namespace
        self.ignore_names = ignore_names
        self.thread = 0  # the thread the block began on
        self.sequence_start = 0  # autograd's sequence number when it began (on that thread)
        # Above 0 while the recorder's own code runs torch calls: those are not the user's ops.
        self.busy = 0
        # Inside one of the user's torch calls, and its site once found: the buffers it saves
        # and the node it makes share one stack walk.
        self.in_call = False
        self.call_site: Site | None = None
        # Ids of buffers saved and not yet given to a node (`nodes.NodeFinder`).
        self.unowned: list[int] = []
        # While a probe reads a node's saved attributes: the buffer ids our unpack hook sees.
        self.probe_hits: list[int] | None = None
        # What the block installed (None once it ended), and what it stepped aside from.
        self.mode: Any = None
        self.pack: Callable[[Any], Any] | None = None
        self.unpack: Callable[[Any], Any] | None = None
        self.suspended: str | None = None

    @property
    def home_code(self) -> CodeType | None:
        """The traced code (the frame running the block, or the cell's code)."""
        return self.sites.home_code
