"""Plain-data records of what autograd did: the model every other module reads.

Records hold ints, strings and tuples only, never live tensors or nodes, so a trace can be kept,
exported to JSON and rendered after the user's objects are gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

FindingKind = Literal[
    "kept-alive",
    "graph-growth",
    "retained-graph",
    "backward-through-freed",
    "inplace-on-saved",
    "shared-write",
    "data-bypass",
    "unused-graph",
]
BlindspotKind = Literal[
    "compiled",
    "saved-tensor-hooks",
    "torch.func",
    "hooks-disabled",
    "jit.trace",
    "naming-cut",
    "naming-skipped",
    "names",
    "internal",
]
BackwardKind = Literal["backward", "grad"]
# Why a saved tensor's memory is not counted as retained: something besides the graph holds it
# (a parameter, a module's buffer, a tensor the user's code still references, a tensor sharing
# its storage, a NumPy array, or a holder outside Python such as autocast's cast cache).
# "" means the graph alone holds it: its death frees the memory.
HeldBy = Literal[
    "", "parameter", "module buffer", "user tensor", "live tensor", "NumPy array", "elsewhere"
]
# How a tensor/array joined a storage group: the op that made it ("detach", "view",
# "__getitem__", "from_numpy", "numpy", ".data", ...: any view op, an open set), "<op> (copy)"
# for a copy, or "original" for the group's first member.
JoinedBy = str


@dataclass(frozen=True)
class Site:
    """A source position: the innermost user frame, plus the line in the traced code."""

    file: str
    line: int
    function: str = "<module>"
    outer_line: int | None = None

    def describe(self) -> str:
        """'line 9', or 'line 4 in forward, called at line 9' for a line inside a function the
        traced code called (the line that ran, then the traced code's call)."""
        if self.outer_line is None or self.outer_line == self.line:
            return f"line {self.line}"
        return f"line {self.line} in {self.function}, called at line {self.outer_line}"


UNKNOWN_SITE = Site(file="<unknown>", line=0)


@dataclass(slots=True)
class NodeRecord:
    """One autograd node seen while tracing; `freed_*` stay None while it is alive."""

    id: int
    name: str
    born_seq: int
    born_site: Site
    next_ids: tuple[int, ...] = ()
    freed_seq: int | None = None
    freed_site: Site | None = None
    existed_before: bool = False
    reached_by: int | None = None  # index of the first backward call that walked this node
    module: str | None = None  # `model.encoder.layers.0.linear1`; None outside any nn.Module

    @property
    def born_line(self) -> int:
        return self.born_site.line

    @property
    def freed_line(self) -> int | None:
        return None if self.freed_site is None else self.freed_site.line

    @property
    def alive(self) -> bool:
        return self.freed_seq is None


@dataclass(slots=True)
class SavedBuffer:
    """A tensor saved for backward ("retained buffer") and when autograd released it."""

    id: int
    node_id: int | None
    shape: tuple[int, ...]
    dtype: str
    device: str
    nbytes: int
    storage_nbytes: int
    is_leaf: bool
    is_parameter: bool
    version: int
    saved_seq: int
    saved_site: Site
    storage_key: int = 0
    label: str = ""
    freed_seq: int | None = None
    freed_site: Site | None = None
    module: str | None = None  # the nn.Module whose forward saved it, as a path; None outside
    held_by: HeldBy = ""  # who else holds its memory, as last read; "" counts it as retained

    @property
    def retained(self) -> bool:
        """True when the graph alone holds this tensor's memory (it counts in retained bytes)."""
        return not self.held_by

    @property
    def freed(self) -> bool:
        return self.freed_seq is not None

    @property
    def freed_line(self) -> int | None:
        return None if self.freed_site is None else self.freed_site.line

    @property
    def saved_line(self) -> int:
        return self.saved_site.line


@dataclass(frozen=True, slots=True)
class AliasLink:
    """`member` got its memory from `source`: shared storage (`shares`) or a copy (not shared)."""

    member: int
    source: int
    how: str
    shares: bool
    seq: int
    site: Site


@dataclass(slots=True)
class VersionBump:
    """An in-place write: version old -> new (equal when the write bypassed the counter)."""

    label: str
    op: str
    old: int
    new: int
    seq: int
    site: Site
    object_id: int = 0
    hit_buffers: tuple[int, ...] = ()
    affected: tuple[str, ...] = ()
    bypass: bool = False
    bypassed_id: int = 0
    bypassed: str = ""
    sharer_ids: tuple[int, ...] = ()
    sharers: tuple[str, ...] = ()
    # A write made inside a library function's body (`F.embedding` renormalizing its weight
    # under max_norm), seen only as the version moving across that call: `op` names the call.
    hidden: bool = False
    module: str | None = None  # the module being called at the write (None: outside any)

    @property
    def line(self) -> int:
        return self.site.line


@dataclass(slots=True)
class BackwardCall:
    """A `backward()` or `torch.autograd.grad` call and what it released."""

    kind: BackwardKind
    seq: int
    site: Site
    retain_graph: bool
    create_graph: bool
    end_seq: int | None = None
    released_buffers: int = 0
    released_bytes: int = 0  # retained memory freed: unique storages only graphs held
    error: str | None = None
    error_type: str | None = None
    root_ids: tuple[int, ...] = ()
    graph_nodes: int = 0
    earlier_nodes: int = 0
    reached: tuple[int, ...] = ()  # node ids walked; kept for retain_graph and failed calls

    @property
    def line(self) -> int:
        return self.site.line


@dataclass(frozen=True)
class StorageGroup:
    """Tensors and arrays sharing one memory block; `copies` maps a copy's label to its source."""

    members: tuple[str, ...]
    how: dict[str, JoinedBy]
    copies: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ModuleStats:
    """One module that ran in the block: its calls, nodes and the bytes its ops saved for
    backward (`saved_bytes` includes submodules, `self_saved_bytes` does not; parameters, which
    the graph does not own, are not counted)."""

    path: str
    type: str
    calls: int
    nodes_created: int
    saved_bytes: int
    self_saved_bytes: int
    peak_retained_bytes: int


@dataclass(frozen=True)
class Snapshot:
    """Live and peak counters of a trace at one moment."""

    live_nodes: int
    retained_bytes: int
    peak_live_nodes: int
    peak_retained_bytes: int
    nodes_created: int
    buffers_saved: int


@dataclass
class Finding:
    """A plain-sentence diagnosis with the line that caused it and what to change."""

    kind: FindingKind
    message: str
    line: int | None
    related_lines: tuple[int, ...] = ()
    holder: str | None = None
    nbytes: int = 0


@dataclass(frozen=True)
class Holder:
    """A user-visible path (`losses[3]`, `crit.loss`) that keeps a live graph root alive."""

    path: str
    node_id: int


class TimelineSample(NamedTuple):
    """State right after an event: (sequence, live nodes, retained bytes, what happened, line)."""

    seq: int
    live_nodes: int
    retained_bytes: int
    what: str
    line: int


@dataclass(frozen=True)
class Blindspot:
    """Something the recorder could not see (compiled code, user saved-tensor hooks, caps hit)."""

    kind: BlindspotKind
    message: str
    line: int | None = None
