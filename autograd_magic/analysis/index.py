"""`RecordIndex`: records by id and the walks over recorded edges, built once per analysis or
render from a trace (the trace itself keeps no index)."""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from typing import Protocol, TypeVar

from autograd_magic.model.records import NodeRecord, SavedBuffer
from autograd_magic.model.trace import Trace


class _Record(Protocol):
    @property
    def id(self) -> int: ...


R = TypeVar("R", bound=_Record)


class RecordIndex:
    """Nodes and buffers by id, buffers by node, backward calls by sequence, and walks over the
    recorded edges. Read-only: build a new one for a trace that changed."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.nodes: Mapping[int, NodeRecord] = RecordsById(trace.nodes)
        self.buffers: Mapping[int, SavedBuffer] = RecordsById(trace.buffers)
        # Buffers grouped by owner: node ids in an array sorted with the buffers' positions
        # (-1: no owner). A dict of a list per node costs ~12 MB at the record cap, this 1.6 MB,
        # and a block's buffers come nearly sorted already: see `buffers_of`.
        owners = array("q", [-1 if b.node_id is None else b.node_id for b in trace.buffers])
        self._owned: array[int] | None = None  # positions in owner order; None: as they are
        if any(owners[i] > owners[i + 1] for i in range(len(owners) - 1)):
            order = sorted(range(len(owners)), key=owners.__getitem__)
            self._owned = array("q", order)
            owners = array("q", [owners[i] for i in order])
        self._owners = owners
        self.backward_seqs = [call.seq for call in trace.backward_calls]

    def epoch(self, seq: int) -> int:
        """How many backward calls started before `seq`: the training iteration it belongs to."""
        return bisect.bisect_left(self.backward_seqs, seq)

    def live_reach(self, roots: Iterable[int]) -> set[int]:
        """Ids of live nodes reachable from `roots` through recorded edges."""
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            node = self.nodes.get(stack.pop())
            if node is None or node.id in seen or not node.alive:
                continue
            seen.add(node.id)
            stack.extend(node.next_ids)
        return seen

    def reach_within(self, root_id: int, allowed: Container[int]) -> set[int]:
        """Ids of the nodes in `allowed` reachable from `root_id` through nodes in `allowed`."""
        seen: set[int] = set()
        stack = [root_id]
        while stack:
            node_id = stack.pop()
            node = self.nodes.get(node_id) if node_id in allowed else None
            if node is None or node_id in seen:
                continue
            seen.add(node_id)
            stack.extend(node.next_ids)
        return seen

    def buffers_of(self, node_ids: Iterable[int], live: bool) -> list[SavedBuffer]:
        """The buffers the given nodes saved (only those not yet released when `live`), per
        node in saving order."""
        owners, owned, buffers = self._owners, self._owned, self.trace.buffers
        found = []
        for node_id in node_ids:
            at = bisect.bisect_left(owners, node_id)
            while at < len(owners) and owners[at] == node_id:
                buffer = buffers[at if owned is None else owned[at]]
                if not live or not buffer.freed:
                    found.append(buffer)
                at += 1
        return found

    def node(self, node_id: int | None) -> NodeRecord | None:
        """The record of a node by id (None when unknown or beyond the record cap)."""
        return None if node_id is None else self.nodes.get(node_id)

    def buffer(self, buffer_id: int) -> SavedBuffer | None:
        """The record of a saved buffer by id (None when beyond the record cap)."""
        return self.buffers.get(buffer_id)


class RecordsById(Mapping[int, R]):
    """Records by id, read from the list a block wrote: there ids are consecutive in list order,
    so a record is found by position with no dict of up to 100,000 entries (a trace loaded
    from elsewhere that is not so gets the dict)."""

    def __init__(self, records: Sequence[R]) -> None:
        self._records = records
        self._first = records[0].id if records else 0
        first = self._first
        consecutive = all(r.id == first + i for i, r in enumerate(records))
        self._by_id: dict[int, R] | None = None if consecutive else {r.id: r for r in records}

    def __getitem__(self, record_id: int) -> R:
        if self._by_id is not None:
            return self._by_id[record_id]
        at = record_id - self._first
        if 0 <= at < len(self._records):
            return self._records[at]
        raise KeyError(record_id)

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_id) if self._by_id is not None else (r.id for r in self._records)

    def __len__(self) -> int:
        return len(self._records) if self._by_id is None else len(self._by_id)


def retained_bytes_of(buffers: Iterable[SavedBuffer]) -> int:
    """Bytes of the unique storages among `buffers` that only graphs hold (what freeing them
    gives back)."""
    storages = {b.storage_key: b.storage_nbytes for b in buffers if b.retained}
    return sum(storages.values())
