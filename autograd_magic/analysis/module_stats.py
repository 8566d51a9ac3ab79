"""Memory by module: what each nn.Module's ops created and saved for backward, from the records.

Saved bytes count tensors saved for backward whose memory only graphs hold (not parameters,
module buffers or tensors the user's code still holds, whose memory outlives the graph), by
`SavedBuffer.nbytes`, so the root module's `saved_bytes` is the sum of the buffers attributed
to it. Records beyond the record cap are not counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from autograd_magic.model.records import ModuleStats, NodeRecord, SavedBuffer


def _ancestors(path: str) -> list[str]:
    """'a.b.c' -> ['a', 'a.b', 'a.b.c']."""
    parts = path.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def module_stats(
    records: Iterable[NodeRecord],
    buffers: Iterable[SavedBuffer],
    module_calls: Mapping[str, int],
    module_types: Mapping[str, str],
) -> list[ModuleStats]:
    """One entry per module that ran (or owns records), largest `saved_bytes` first."""
    paths = set(module_calls)
    nodes: dict[str, int] = {}
    for node in records:
        if node.module is not None:
            nodes[node.module] = nodes.get(node.module, 0) + 1
            paths.add(node.module)
    own: dict[str, int] = {}
    events: dict[str, list[tuple[int, int, int, int]]] = {}
    for buffer in buffers:
        if buffer.module is None or not buffer.retained:
            continue
        paths.add(buffer.module)
        own[buffer.module] = own.get(buffer.module, 0) + buffer.nbytes
        storage = buffer.storage_key or -buffer.id
        for path in _ancestors(buffer.module):
            timeline = events.setdefault(path, [])
            timeline.append((buffer.saved_seq, 1, storage, buffer.nbytes))
            if buffer.freed_seq is not None:
                timeline.append((buffer.freed_seq, -1, storage, buffer.nbytes))
    total: dict[str, int] = {}
    created: dict[str, int] = {}
    for path in paths:
        for ancestor in _ancestors(path):
            total[ancestor] = total.get(ancestor, 0) + own.get(path, 0)
            created[ancestor] = created.get(ancestor, 0) + nodes.get(path, 0)
    stats = [
        ModuleStats(
            path=path,
            type=module_types.get(path, ""),
            calls=module_calls.get(path, 0),
            nodes_created=created.get(path, 0),
            saved_bytes=total.get(path, 0),
            self_saved_bytes=own.get(path, 0),
            peak_retained_bytes=_peak(events.get(path, [])),
        )
        for path in {a for p in paths for a in _ancestors(p)}
    ]
    return sorted(stats, key=lambda m: (-m.saved_bytes, m.path))


def _peak(events: list[tuple[int, int, int, int]]) -> int:
    """The most bytes held at once, from (sequence, +1 saved / -1 released, storage, bytes)
    events; a storage saved twice (ReLU's output, saved by the ReLU and the next Linear) counts
    once while either holds it, as in the summary's retained bytes."""
    held: dict[int, list[int]] = {}  # storage -> [holders, bytes counted for it]
    level = peak = 0
    for _, step, storage, nbytes in sorted(events):
        entry = held.setdefault(storage, [0, 0])
        entry[0] += step
        if step == 1 and nbytes > entry[1]:
            level += nbytes - entry[1]  # the largest view of a storage saved so far
            entry[1] = nbytes
        elif entry[0] == 0:
            level -= entry[1]
            entry[1] = 0
        peak = max(peak, level)
    return peak
