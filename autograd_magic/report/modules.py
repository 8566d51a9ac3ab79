"""The Modules view: which nn.Module's ops saved the memory, as a tree table with a bar per row
and one headline naming the repeated structure that holds most of it."""

from __future__ import annotations

from collections.abc import Mapping

from autograd_magic.analysis.result import Analysis
from autograd_magic.model.records import ModuleStats
from autograd_magic.model.units import format_bytes, layer_pattern
from autograd_magic.report.model import MAX_TABLE_ROWS, Table

BAR_WIDTH = 10
INDENT = "\u00a0" * 3
pattern_of = layer_pattern  # `model.h.3.mlp` -> `model.h.*.mlp`


def _bar(share: float) -> str:
    """A text bar for `share` of the whole (0..1), readable in text, HTML and both themes."""
    eighths = round(max(0.0, min(1.0, share)) * BAR_WIDTH * 8)
    full, rest = divmod(eighths, 8)
    return "█" * full + ("" if rest == 0 else " ▏▎▍▌▋▊▉"[rest])


def top_modules(analysis: Analysis, count: int = 3) -> list[tuple[str, float]]:
    """The repeated structures whose own ops saved the most, with their share of all the bytes
    saved inside modules: [('encoder.layers.*.self_attn', 0.45), ...]; a module that also has
    submodules is named with ' (own ops)'."""
    return [(name, share) for name, share, _ in _top_groups(analysis, count)]


def _top_groups(analysis: Analysis, count: int) -> list[tuple[str, float, int]]:
    """`top_modules` with how many modules each entry adds up."""
    stats = analysis.modules
    total = sum(m.self_saved_bytes for m in stats)
    if total <= 0:
        return []
    # Repeated structure is the same pattern and the same class (`layers.0`, `layers.1`: both
    # encoder layers); a Sequential's differing children stay apart (`model.0`, `model.1`).
    groups: dict[tuple[str, str], list[ModuleStats]] = {}
    for m in stats:
        if m.self_saved_bytes:
            groups.setdefault((pattern_of(m.path), m.type), []).append(m)
    mixed = _mixed_containers(analysis.trace.module_types)
    for key, members in list(groups.items()):
        if len(members) > 1 and any(_in_mixed(m.path, mixed) for m in members):
            del groups[key]  # a Sequential's two Linear layers are not one repeated structure
            groups.update({(m.path, m.type): [m] for m in members})
    parents = {m.path.rpartition(".")[0] for m in stats}
    by_pattern: dict[str, int] = {}
    modules: dict[str, int] = {}
    for (pattern, _), members in groups.items():
        name = pattern if len(members) > 1 else members[0].path
        if members[0].path in parents:
            # Its submodules have their own entries: these are the bytes of its own ops.
            name += " (own ops)"
        by_pattern[name] = by_pattern.get(name, 0) + sum(m.self_saved_bytes for m in members)
        modules[name] = modules.get(name, 0) + len(members)
    ranked = sorted(by_pattern.items(), key=lambda kv: (-kv[1], kv[0]))[:count]
    # Shares that round to 0% say nothing.
    return [(path, n / total, modules[path]) for path, n in ranked if n / total >= 0.005]


def _mixed_containers(types: Mapping[str, str]) -> set[str]:
    """Containers whose numbered children are of different classes (`Sequential(Linear, ReLU,
    Linear)`), as opposed to a list of one layer repeated."""
    kinds: dict[str, set[str]] = {}
    for path, kind in types.items():
        parent, _, last = path.rpartition(".")
        if last.isdigit():
            kinds.setdefault(parent, set()).add(kind)
    return {parent for parent, found in kinds.items() if len(found) > 1}


def _in_mixed(path: str, mixed: set[str]) -> bool:
    """True when an index in `path` is the index of a mixed container's child."""
    parts = path.split(".")
    return any(part.isdigit() and ".".join(parts[:i]) in mixed for i, part in enumerate(parts))


def top_modules_text(analysis: Analysis) -> str:
    """'model.h.*.mlp 62%, model.h.*.attn 30%' or '' when no module saved anything. Only for a
    finished trace: while it records, module paths still start with a placeholder for the
    root's name (`<0>.h.1`), resolved when the block ends."""
    if not analysis.trace.finished:
        return ""
    # A pattern adds up its modules (the table has a row each): say how many, once when every
    # pattern adds up as many (4 layers: not '(4 modules together)' after each).
    groups = _top_groups(analysis, 3)
    counts = {n for _, _, n in groups}
    if len(groups) > 1 and len(counts) == 1 and counts != {1}:
        parts = ", ".join(f"{path} {share:.0%}" for path, share, _ in groups)
        return f"{parts} (each pattern adds up its {counts.pop()} modules)"
    return ", ".join(
        f"{path} {share:.0%}" + (f" ({n} modules together)" if n > 1 else "")
        for path, share, n in groups
    )


def module_table(analysis: Analysis, limit: int = MAX_TABLE_ROWS) -> Table:
    """One row per module, as a tree (children under their parent, largest first), with saved
    bytes including submodules, the module's own share, calls and the peak held at once.
    Repeated layers identical to the first of them (same class, numbers and submodules) share
    one row under it: '1-3  TransformerEncoderLayer x3 (each as 0)'."""
    stats = analysis.modules
    if not stats:
        return Table("Memory by module", (), ())
    children: dict[str, list[ModuleStats]] = {}
    roots = []
    paths = {m.path for m in stats}
    for m in stats:  # already largest first
        parent = m.path.rpartition(".")[0]
        if parent in paths:
            children.setdefault(parent, []).append(m)
        else:
            roots.append(m)
    whole = sum(m.saved_bytes for m in roots) or 1
    rows: list[tuple[str, ...]] = []

    def add(m: ModuleStats, depth: int) -> None:
        # No-break spaces: the tree keeps its indentation in HTML as in text.
        name = m.path if depth == 0 else INDENT * depth + _last(m.path)
        rows.append((name, m.type, *_numbers(m, whole)))
        for first, same in _repeats(children.get(m.path, []), children):
            add(first, depth + 1)
            if same:
                names = _span([_last(x.path) for x in same])
                like = _last(first.path)
                what = (
                    f"{first.type} x{len(same)} (each as {like})"
                    if len(same) > 1
                    else (f"{first.type} (as {like})")
                )
                rows.append((INDENT * (depth + 1) + names, what, *_numbers(first, whole)))

    for root in roots:
        add(root, 0)
    note = COUNTS_NOTE
    if len(rows) > limit:
        note = f"Showing {limit} of {len(rows):,} modules. {note}"
    return Table("Memory by module", HEADERS, tuple(rows[:limit]), note)


HEADERS = (
    "module",
    "type",
    "share",
    "saved, all calls",
    "own ops, all calls",
    "peak held at once",
    "calls",
    "nodes",
)
COUNTS_NOTE = (
    "Saved bytes count what only the graphs hold (not parameters, nor tensors your code still "
    "holds: the Buffers tab lists those too) and add up every call of a module (a loop of 20 "
    "steps counts 20 forward passes); peak held is the most its saved tensors held at one moment."
)


def _numbers(m: ModuleStats, whole: int) -> tuple[str, ...]:
    share = m.saved_bytes / whole
    return (
        f"{_bar(share)} {share:.0%}".lstrip() if m.saved_bytes else "",
        format_bytes(m.saved_bytes),
        format_bytes(m.self_saved_bytes),
        format_bytes(m.peak_retained_bytes),
        f"{m.calls:,}",
        f"{m.nodes_created:,}",
    )


def _last(path: str) -> str:
    return path.rpartition(".")[2]


def _signature(m: ModuleStats, children: dict[str, list[ModuleStats]]) -> tuple:
    """What a module shows, its name aside: class, numbers, and its submodules' signatures."""
    own = (m.type, m.saved_bytes, m.self_saved_bytes, m.peak_retained_bytes, m.calls)
    below = tuple((_last(c.path), _signature(c, children)) for c in children.get(m.path, []))
    return (*own, m.nodes_created, below)


def _repeats(
    siblings: list[ModuleStats], children: dict[str, list[ModuleStats]]
) -> list[tuple[ModuleStats, list[ModuleStats]]]:
    """Siblings grouped by signature, in order: (the first, the numbered others alike)."""
    groups: dict[tuple, tuple[ModuleStats, list[ModuleStats]]] = {}
    for m in siblings:
        if not _last(m.path).isdigit():
            groups[(m.path,)] = (m, [])
            continue
        key = _signature(m, children)
        if key in groups:
            groups[key][1].append(m)
        else:
            groups[key] = (m, [])
    return list(groups.values())


def _span(names: list[str]) -> str:
    """['1', '2', '3'] -> '1-3'; ['1', '3'] -> '1, 3'."""
    numbers = sorted(int(n) for n in names)
    if numbers == list(range(numbers[0], numbers[-1] + 1)) and len(numbers) > 2:
        return f"{numbers[0]}-{numbers[-1]}"
    return ", ".join(str(n) for n in numbers)
