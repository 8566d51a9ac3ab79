"""Which box of the graph view each autograd node falls in: one box per nn.Module at a depth
(leaves folded into the box that uses them, repeated layers merged when over budget), or, for
nodes outside modules, one box per node merged by repeated structure and line when over budget.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from autograd_magic.model.records import NodeRecord
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import ACCUMULATE_GRAD, LAYER_INDEX

OPS = -1  # the depth that shows every op, modules or not
READABLE_BOXES = 40  # the automatic depth is the deepest whose boxes all fit labelled
STRUCTURE_DEPTH = 3

Key = Callable[[NodeRecord], Hashable]


@dataclass(frozen=True)
class ModuleBox:
    """What a module box shows: its path (`layers.0-3` when merged), the path without the root
    model's name when there is one root (`name`), its class and how many modules it merges."""

    path: str
    name: str
    type: str
    modules: int = 1


@dataclass
class Grouping:
    """Box key per node, the module depth used (`OPS`: none), the deepest offered and a note."""

    key: Key
    depth: int
    max_depth: int
    note: str
    modules: dict[Hashable, ModuleBox]


def group(
    trace: Trace,
    records: list[NodeRecord],
    next_ids: dict[int, tuple[int, ...]],
    users: dict[int, list[int]],
    max_nodes: int,
    depth: int | None = None,
) -> Grouping:
    """Group `records` into at most `max_nodes` boxes (by module at `depth` when the trace has
    module paths; None picks the deepest depth whose boxes fit `READABLE_BOXES`)."""
    chains = _chains(trace, records)
    deepest = max((len(c) - 1 for c in chains.values()), default=-1)
    if deepest < 0 or depth == OPS:
        key, note = collapse(records, next_ids, max_nodes)
        return Grouping(key, OPS, max(deepest, 1) if chains else 0, note, {})
    deepest = max(deepest, 1)
    if depth is None:
        budget = min(max_nodes, READABLE_BOXES)
        parents = {c[i] for c in chains.values() for i in range(len(c) - 1)}
        fits = [d for d in range(1, deepest + 1) if _count(records, chains, parents, d) <= budget]
        depth = max(fits, default=1)
    else:
        budget, depth = max_nodes, min(max(depth, 1), deepest)
    key, note, modules = _by_module(trace, records, next_ids, users, chains, depth, budget)
    return Grouping(key, depth, deepest, note, modules)


def _chains(trace: Trace, records: list[NodeRecord]) -> dict[str, list[str]]:
    """Each module path's ancestors that ran (containers like ModuleList never do), root first."""
    chains: dict[str, list[str]] = {}
    ran = trace.module_calls
    for record in records:
        path = record.module
        if path is None or path in chains:
            continue
        parts = path.split(".")
        found = [".".join(parts[: i + 1]) for i in range(len(parts))]
        chains[path] = [p for p in found if p in ran or p == path]
    return chains


def _box_path(chain: list[str], parents: set[str], depth: int) -> str | None:
    """The module box at `depth`: the ancestor there, the node's own module when it is shallower
    and has no children, else None (a container's own op, shown as itself)."""
    if len(chain) > depth:
        return chain[depth]
    return None if chain[-1] in parents else chain[-1]


def _count(
    records: list[NodeRecord], chains: dict[str, list[str]], parents: set[str], depth: int
) -> int:
    """Boxes at `depth`: modules, a container's own ops, and ops outside modules (one per type
    and line when they are many: a loop's loss)."""
    boxes: set[str] = set()
    own = 0
    outside: list[NodeRecord] = []
    for record in records:
        if record.name == ACCUMULATE_GRAD:
            continue  # folded into the box that uses it
        if record.module is None:
            outside.append(record)
            continue
        path = _box_path(chains[record.module], parents, depth)
        if path is None:
            own += 1
        else:
            boxes.add(path)
    if len(outside) > READABLE_BOXES // 2:
        return len(boxes) + own + len({(r.born_site, r.name) for r in outside})
    return len(boxes) + own + len(outside)


def _by_module(
    trace: Trace,
    records: list[NodeRecord],
    next_ids: dict[int, tuple[int, ...]],
    users: dict[int, list[int]],
    chains: dict[str, list[str]],
    depth: int,
    budget: int,
) -> tuple[Key, str, dict[Hashable, ModuleBox]]:
    """Module boxes at `depth` (repeats merged to fit `budget`), other ops as themselves."""
    parents = {c[i] for c in chains.values() for i in range(len(c) - 1)}
    box_of: dict[int, str] = {}
    for record in records:
        if record.module is not None and record.name != ACCUMULATE_GRAD:
            path = _box_path(chains[record.module], parents, depth)
            if path is not None:
                box_of[record.id] = path
    ops = [r for r in records if r.id not in box_of and not _folded(r, users)]
    paths = set(box_of.values())
    # Ops outside modules get what modules leave, and at least half the budget.
    op_key, note = collapse(ops, next_ids, max(budget // 2, budget - len(paths), 1))
    op_boxes = len({op_key(r) for r in ops})
    merged = _merge_repeats(paths, max(1, budget - op_boxes))
    shown = set(merged.values())
    keys: dict[int, Hashable] = {i: ("module", merged[p]) for i, p in box_of.items()}
    for record in ops:
        keys[record.id] = op_key(record)
    for record in records:  # leaves last: every user already has its key
        if record.id not in keys:
            keys[record.id] = keys[users[record.id][0]]
    roots = {c[0] for c in chains.values()}
    strip = f"{next(iter(roots))}." if len(roots) == 1 else "\0"
    modules: dict[Hashable, ModuleBox] = {}
    for path, shown_as in merged.items():
        box = modules.get(("module", shown_as))
        count = 1 if box is None else box.modules + 1
        name = shown_as.removeprefix(strip)
        kind = trace.module_types.get(path, "")
        modules[("module", shown_as)] = ModuleBox(shown_as, name, kind, count)
    parts = [f"outside modules, {note}"] if note else []
    if len(shown) < len(merged):
        parts.insert(0, f"repeated layers merged ({len(merged):,} modules in {len(shown):,} boxes)")
    return (lambda r: keys[r.id]), "; ".join(parts), modules


def _folded(record: NodeRecord, users: dict[int, list[int]]) -> bool:
    """A leaf (AccumulateGrad) that some recorded node uses: drawn inside that node's box."""
    return record.name == ACCUMULATE_GRAD and bool(users.get(record.id))


def _merge_repeats(paths: set[str], budget: int) -> dict[str, str]:
    """Each path -> the path shown: itself, or `layers.0-3` when consecutive repeated layers
    (same path but for the first index) are merged in runs of 2, 4, 8... to fit `budget`."""
    shown = {p: p for p in paths}
    size = 2
    while len(set(shown.values())) > budget and size < 2 * max(len(paths), 1):
        runs: dict[tuple[str, int, str], list[tuple[int, str]]] = {}
        for path in paths:
            match = LAYER_INDEX.search(path)
            if match is None:
                continue
            index = int(match.group(0))
            head, tail = path[: match.start() - 1], path[match.end() :]  # the dot left out
            runs.setdefault((head, index // size, tail), []).append((index, path))
        for (head, _, tail), members in runs.items():
            low, high = min(members)[0], max(members)[0]
            name = f"{head}.{low}" + (f"-{high}" if high > low else "") + tail
            for _, path in members:
                shown[path] = name
        size *= 2
    return shown


def collapse(
    records: list[NodeRecord], next_ids: dict[int, tuple[int, ...]], max_nodes: int
) -> tuple[Key, str]:
    """The finest grouping of `records` that fits in `max_nodes` boxes, and what it merged ('':
    one box per node, when they fit)."""
    n = len(records)
    if n <= max_nodes:
        return (lambda r: ("node", r.id)), ""
    shape = _structure(records, next_ids)
    levels: list[tuple[str, Key]] = [
        (
            "repeated nodes share a box marked xN (N nodes of one type, made on one line, "
            f"with the same graph for {STRUCTURE_DEPTH} levels beneath them)",
            lambda r: ("shape", r.born_site, shape[r.id]),
        ),
        (
            "nodes of one type made on one line share a box marked xN (N nodes)",
            lambda r: ("line-type", r.born_site, r.name),
        ),
        (
            "all nodes made on one line share a box marked xN (N nodes)",
            lambda r: ("line", r.born_site),
        ),
    ]
    for text, key in levels:
        if len({key(r) for r in records}) <= max_nodes:
            return key, text
    sizes: dict[tuple, int] = {}
    for record in records:
        sizes[("line", record.born_site)] = sizes.get(("line", record.born_site), 0) + 1
    kept = set(sorted(sizes, key=sizes.__getitem__, reverse=True)[: max_nodes - 1])
    other = len(sizes) - len(kept)

    def by_line(r: NodeRecord) -> tuple:
        key = ("line", r.born_site)
        return key if key in kept else ("other",)

    note = (
        "nodes made on one line share a box, and those of the "
        f"{other:,} lines with the fewest nodes share the 'other lines' box"
    )
    return by_line, note


def _structure(records: list[NodeRecord], next_ids: dict[int, tuple[int, ...]]) -> dict[int, int]:
    """A hash of each node's type, line and the graph `STRUCTURE_DEPTH` levels beneath it."""
    base = {r.id: hash((r.name, r.born_site)) for r in records}
    current = base
    for _ in range(STRUCTURE_DEPTH):
        current = {
            node: hash((own, tuple(sorted(current[c] for c in next_ids[node] if c in current))))
            for node, own in base.items()
        }
    return current
