"""The Modules view: which nn.Module's ops saved the memory, as a tree table with a bar per row
and one headline naming the repeated structure that holds most of it."""

from __future__ import annotations

import re

from autograd_magic.model.records import ModuleStats
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import format_bytes
from autograd_magic.views.tables import MAX_TABLE_ROWS, Table

BAR_WIDTH = 16
_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def pattern_of(path: str) -> str:
    """`model.h.3.mlp` -> `model.h.*.mlp`: the repeated structure a path belongs to."""
    return _INDEX.sub("*", path)


def _bar(share: float) -> str:
    """A text bar for `share` of the whole (0..1), readable in text, HTML and both themes."""
    eighths = round(max(0.0, min(1.0, share)) * BAR_WIDTH * 8)
    full, rest = divmod(eighths, 8)
    return "█" * full + ("" if rest == 0 else " ▏▎▍▌▋▊▉"[rest])


def top_modules(trace: Trace, count: int = 3) -> list[tuple[str, float]]:
    """The repeated structures whose own ops saved the most, with their share of all the bytes
    saved inside modules: [('encoder.layers.*.self_attn', 0.45), ...]."""
    stats = trace.modules()
    total = sum(m.self_saved_bytes for m in stats)
    if total <= 0:
        return []
    # Repeated structure is the same pattern and the same class (`layers.0`, `layers.1`: both
    # encoder layers); a Sequential's differing children stay apart (`model.0`, `model.1`).
    groups: dict[tuple[str, str], list[ModuleStats]] = {}
    for m in stats:
        if m.self_saved_bytes:
            groups.setdefault((pattern_of(m.path), m.type), []).append(m)
    by_pattern: dict[str, int] = {}
    for (pattern, _), members in groups.items():
        name = pattern if len(members) > 1 else members[0].path
        by_pattern[name] = by_pattern.get(name, 0) + sum(m.self_saved_bytes for m in members)
    ranked = sorted(by_pattern.items(), key=lambda kv: (-kv[1], kv[0]))[:count]
    # Shares that round to 0% say nothing.
    return [(path, n / total) for path, n in ranked if n / total >= 0.005]


def top_modules_text(trace: Trace) -> str:
    """'model.h.*.mlp 62%, model.h.*.attn 30%' or '' when no module saved anything. Only for a
    finished trace: while it records, module paths still start with a placeholder for the
    root's name (`<0>.h.1`), resolved when the block ends."""
    if not trace.finished:
        return ""
    return ", ".join(f"{path} {share:.0%}" for path, share in top_modules(trace))


def module_table(trace: Trace, limit: int = MAX_TABLE_ROWS) -> Table:
    """One row per module, as a tree (children under their parent, largest first), with saved
    bytes including submodules, the module's own share, calls and the peak held at once."""
    stats = trace.modules()
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
        name = m.path if depth == 0 else "  " * depth + m.path.rpartition(".")[2]
        share = m.saved_bytes / whole
        rows.append(
            (
                name,
                m.type,
                f"{_bar(share)} {share:.0%}" if m.saved_bytes else "",
                format_bytes(m.saved_bytes),
                format_bytes(m.self_saved_bytes),
                format_bytes(m.peak_retained_bytes),
                f"{m.calls:,}",
                f"{m.nodes_created:,}",
            )
        )
        for child in children.get(m.path, ()):
            add(child, depth + 1)

    for root in roots:
        add(root, 0)
    note = ""
    if len(rows) > limit:
        note = f"Showing {limit} of {len(rows):,} modules."
    headers = ("module", "type", "share", "saved", "own ops", "peak held", "calls", "nodes")
    return Table("Memory by module", headers, tuple(rows[:limit]), note)
