"""Shared pieces of the findings: source text, record indexes, common wording."""

from __future__ import annotations

import bisect
import linecache
from collections.abc import Container, Iterable

from autograd_magic.model.records import Finding, NodeRecord, SavedBuffer, Site
from autograd_magic.model.trace import Trace

FREED_TWICE = "backward through the graph a second time"
INPLACE_ERROR = (
    "'one of the variables needed for gradient computation has been modified by an inplace "
    "operation'"
)


def source_of(site: Site) -> str:
    """The source text of a site's line, or '' when the file is not available."""
    return linecache.getline(site.file, site.line).strip()


def quoted_code(site: Site) -> str:
    """' (`code`)' for a site already described with its function line."""
    text = source_of(site)
    return f" (`{text}`)" if text else ""


def quoted_source(site: Site) -> str:
    """' (`code`)' after a cell line; for code inside a function the quote says where it is,
    since the cell line (a call) and the quoted line differ."""
    text = source_of(site)
    if not text:
        return ""
    if site.outer_line is not None and site.outer_line != site.line:
        return f" (in {site.function} line {site.line}: `{text}`)"
    return f" (`{text}`)"


class RecordIndex:
    """Indexes over the records that several findings share."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.buffers_by_node: dict[int, list[SavedBuffer]] = {}
        for buffer in trace.buffers:
            if buffer.node_id is not None:
                self.buffers_by_node.setdefault(buffer.node_id, []).append(buffer)
        self.backward_seqs = [call.seq for call in trace.backward_calls]
        # Set by graph-growth: the carried variable and its line, the root cause that
        # retained-graph and the optimizer's in-place findings then name as theirs.
        self.carried: tuple[str, int] | None = None
        self.consequences: list[Finding] = []

    def epoch(self, seq: int) -> int:
        """How many backward calls started before `seq`: the training iteration it belongs to."""
        return bisect.bisect_left(self.backward_seqs, seq)

    def live_reach(self, roots: Iterable[int]) -> set[int]:
        """Ids of live nodes reachable from `roots` through recorded edges."""
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            node = self.trace.node(stack.pop())
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
            node = self.trace.node(node_id) if node_id in allowed else None
            if node is None or node_id in seen:
                continue
            seen.add(node_id)
            stack.extend(node.next_ids)
        return seen

    def buffers_of(self, node_ids: Iterable[int], live: bool) -> list[SavedBuffer]:
        return [
            b for n in node_ids for b in self.buffers_by_node.get(n, ()) if not live or not b.freed
        ]

    def node(self, node_id: int) -> NodeRecord | None:
        return self.trace.node(node_id)


def retained_bytes_of(buffers: Iterable[SavedBuffer]) -> int:
    """Bytes of the unique non-leaf storages among `buffers` (what freeing them gives back)."""
    storages = {b.storage_key: b.storage_nbytes for b in buffers if not b.is_leaf}
    return sum(storages.values())


def line_list(lines: Iterable[int]) -> str:
    ordered = sorted(set(lines))
    if len(ordered) > 4:
        ordered = [*ordered[:3], ordered[-1]]
        return ", ".join(str(x) for x in ordered[:3]) + f", ... {ordered[-1]}"
    return ", ".join(str(x) for x in ordered)


def name_list(names: Iterable[str], noun: str) -> str:
    """'a, b, c' or 'a, b, ... (5 parameters)' for many names of one kind."""
    unique = list(dict.fromkeys(names))
    if len(unique) <= 3:
        return ", ".join(unique)
    return f"{unique[0]}, {unique[1]}, ... ({len(unique):,} {noun})"


def because(graph: RecordIndex) -> str:
    """'Because `h` carries the previous iteration's graph (line 16), ' or '' without a cause."""
    if graph.carried is None:
        return ""
    holder, line = graph.carried
    return (
        f"Because `{holder}` carries the previous iteration's graph (line {line}, the first "
        f"finding), "
    )
