"""`RecordIndex`: records by id and the walks over recorded edges, built once per analysis or
render from a trace (the trace itself keeps no index)."""

from __future__ import annotations

import bisect
from collections.abc import Container, Iterable

from autograd_magic.model.records import NodeRecord, SavedBuffer
from autograd_magic.model.trace import Trace


class RecordIndex:
    """Nodes and buffers by id, buffers by node, backward calls by sequence, and walks over the
    recorded edges. Read-only: build a new one for a trace that changed."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.nodes: dict[int, NodeRecord] = {n.id: n for n in trace.nodes}
        self.buffers: dict[int, SavedBuffer] = {b.id: b for b in trace.buffers}
        self.buffers_by_node: dict[int, list[SavedBuffer]] = {}
        for buffer in trace.buffers:
            if buffer.node_id is not None:
                self.buffers_by_node.setdefault(buffer.node_id, []).append(buffer)
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
        """The buffers the given nodes saved (only those not yet released when `live`)."""
        return [
            b for n in node_ids for b in self.buffers_by_node.get(n, ()) if not live or not b.freed
        ]

    def node(self, node_id: int | None) -> NodeRecord | None:
        """The record of a node by id (None when unknown or beyond the record cap)."""
        return None if node_id is None else self.nodes.get(node_id)

    def buffer(self, buffer_id: int) -> SavedBuffer | None:
        """The record of a saved buffer by id (None when beyond the record cap)."""
        return self.buffers.get(buffer_id)


def retained_bytes_of(buffers: Iterable[SavedBuffer]) -> int:
    """Bytes of the unique storages among `buffers` that only graphs hold (what freeing them
    gives back)."""
    storages = {b.storage_key: b.storage_nbytes for b in buffers if b.retained}
    return sum(storages.values())
