"""Findings: what the records mean for the user, as plain sentences naming variables and lines.

Pure functions of a finished `Trace` (records only, no live objects), so they run the same on a
trace loaded from JSON. Each kind is one small function; `analyze` runs them all.
"""

from __future__ import annotations

import bisect
import linecache
from collections import Counter
from collections.abc import Callable, Iterable

from autograd_magic.records import Finding, NodeRecord, SavedBuffer, Site, VersionBump
from autograd_magic.trace import Trace

KINDS = (
    "kept-alive",
    "graph-growth",
    "retained-graph",
    "backward-through-freed",
    "inplace-on-saved",
    "shared-write",
    "data-bypass",
    "unused-graph",
)
_ACCUMULATE = "AccumulateGrad"
_FREED_TWICE = "backward through the graph a second time"
_INPLACE_ERROR = (
    "'one of the variables needed for gradient computation has been modified by an inplace "
    "operation'"
)


def format_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def cell_line(site: Site) -> int:
    """The line in the traced code (the cell or script), even for events inside a forward."""
    return site.outer_line if site.outer_line is not None else site.line


def source_of(site: Site) -> str:
    """The source text of a site's line, or '' when the file is not available."""
    return linecache.getline(site.file, site.line).strip()


def _quoted(site: Site) -> str:
    text = source_of(site)
    return f" (`{text}`)" if text else ""


class _Graph:
    """Indexes over the records that several findings share."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
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
            node = self.trace.node(stack.pop())
            if node is None or node.id in seen or not node.alive:
                continue
            seen.add(node.id)
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


def _lines(lines: Iterable[int]) -> str:
    ordered = sorted(set(lines))
    if len(ordered) > 4:
        ordered = [*ordered[:3], ordered[-1]]
        return ", ".join(str(x) for x in ordered[:3]) + f", ... {ordered[-1]}"
    return ", ".join(str(x) for x in ordered)


# ----- kept-alive -------------------------------------------------------------------------
def _holder_group(path: str) -> str:
    """`losses[3]` -> `losses`: elements of one container are reported together."""
    return path.split("[", 1)[0] if "[" in path else path


def kept_alive(trace: Trace, graph: _Graph) -> list[Finding]:
    """User variables, container elements or attributes keeping graphs alive past their use."""
    groups: dict[str, list[NodeRecord]] = {}
    for holder in trace.holders:
        node = graph.node(holder.node_id)
        if node is not None and node.alive and node.name != _ACCUMULATE:
            groups.setdefault(_holder_group(holder.path), []).append(node)
    findings = []
    for path, roots in groups.items():
        finding = _kept_alive_chain(path, roots[0], graph) if len(roots) == 1 else None
        if finding is None and ("[" in path or "." in path or len(roots) > 1):
            finding = _kept_alive_container(path, roots, graph)
        if finding is not None:
            findings.append(finding)
    return findings


def _kept_alive_chain(path: str, root: NodeRecord, graph: _Graph) -> Finding | None:
    """A plain variable that adds each iteration's loss to itself (`total_loss += loss`)."""
    nodes = graph.live_reach([root.id])
    # Links made by an accumulator are never walked by a backward; a carried state's links are
    # (graph-growth and backward-through-freed report those).
    same_line = [
        n
        for n in map(graph.node, nodes)
        if n is not None
        and n.name != _ACCUMULATE
        and n.born_site == root.born_site
        and n.reached_by is None
    ]
    epochs = {graph.epoch(n.born_seq) for n in same_line}
    if len(same_line) < 2 or len(epochs) < 2:
        return None
    nbytes = retained_bytes_of(graph.buffers_of(nodes, live=True))
    line = cell_line(root.born_site)
    message = (
        f"`{path}` keeps every iteration's graph alive: line {line}{_quoted(root.born_site)} "
        f"adds each new result to it, so {len(epochs)} iterations' graphs ({len(nodes)} nodes"
        f"{', ' + format_bytes(nbytes) + ' saved' if nbytes else ''}) are chained together and "
        f"never freed. Accumulate a number instead: `{path} += loss.item()` (or `loss.detach()`)."
    )
    return Finding("kept-alive", message, line, (), path, nbytes)


def _kept_alive_container(path: str, roots: list[NodeRecord], graph: _Graph) -> Finding | None:
    """Container elements or object attributes holding graphs after a backward used them."""
    nodes = graph.live_reach(n.id for n in roots)
    if all(graph.node(i).name == _ACCUMULATE for i in nodes):
        return None
    used = any((n := graph.node(i)) is not None and n.reached_by is not None for i in nodes) or any(
        graph.epoch(r.born_seq) < len(graph.backward_seqs) for r in roots
    )
    if not used and len(roots) < 2:
        return None
    nbytes = retained_bytes_of(graph.buffers_of(nodes, live=True))
    first = min(roots, key=lambda n: n.born_seq)
    line = cell_line(first.born_site)
    saved = f", {format_bytes(nbytes)} of saved tensors" if nbytes else ""
    what = (
        f"{len(roots)} tensors that still carry their autograd graphs"
        if len(roots) > 1
        else "a tensor that still carries its autograd graph"
    )
    message = (
        f"`{path}` holds {what} ({len(nodes)} nodes{saved}), computed at line {line}"
        f"{_quoted(first.born_site)}; the graphs stay in memory as long as `{path}` does. "
        f"Keep `.item()` or `.detach()` of the value instead of the tensor itself."
    )
    related = tuple(sorted({cell_line(r.born_site) for r in roots} - {line}))
    return Finding("kept-alive", message, line, related, path, nbytes)


# ----- graph-growth, retained-graph, backward-through-freed -----------------------------
def graph_growth(trace: Trace, graph: _Graph) -> list[Finding]:
    """Backward after backward walks nodes of earlier iterations, and the graph keeps growing."""
    calls = [c for c in trace.backward_calls if c.earlier_nodes > 0 and c.error is None]
    if len(calls) < 2 or calls[-1].graph_nodes <= calls[0].graph_nodes:
        return []
    carried = _carried_sites(trace, graph)
    if not carried:
        return []
    site = carried.most_common(1)[0][0]
    line = cell_line(site)
    holder = _holder_born_at(trace, graph, site) or "the carried value"
    retain = any(c.retain_graph for c in calls)
    message = (
        f"Each iteration's graph links to the previous one through `{holder}` (computed at line "
        f"{line}{_quoted(site)}): the backward at line {cell_line(calls[-1].site)} walked "
        f"{calls[-1].earlier_nodes} nodes from earlier iterations, and the graph grew from "
        f"{calls[0].graph_nodes} to {calls[-1].graph_nodes} nodes over {len(calls) + 1} backward "
        f"calls. Detach the carried value once per iteration (`{holder} = {holder}.detach()` "
        f"before it is used again)"
        + (", then retain_graph=True is no longer needed." if retain else ".")
    )
    related = tuple(sorted({cell_line(c.site) for c in calls}))
    return [Finding("graph-growth", message, line, related, holder, trace.peak_retained_bytes)]


def _carried_sites(trace: Trace, graph: _Graph) -> Counter[Site]:
    """Sites of values computed in one iteration and consumed in a later one."""
    carried: Counter[Site] = Counter()
    for node in trace.nodes:
        epoch = graph.epoch(node.born_seq)
        for child_id in node.next_ids:
            child = graph.node(child_id)
            if (
                child is not None
                and child.name != _ACCUMULATE
                and not child.existed_before
                and graph.epoch(child.born_seq) < epoch
            ):
                carried[child.born_site] += 1
    return carried


def _holder_born_at(trace: Trace, graph: _Graph, site: Site) -> str | None:
    for holder in trace.holders:
        node = graph.node(holder.node_id)
        if node is not None and node.born_site == site:
            return holder.path
    return None


def _root_name(trace: Trace, root_ids: tuple[int, ...]) -> str | None:
    names = {h.node_id: h.path for h in trace.holders}
    for node_id in root_ids:
        if node_id in names:
            return names[node_id]
    return None


def retained_graph(trace: Trace, graph: _Graph) -> list[Finding]:
    """`retain_graph=True` calls whose kept buffers no later backward released."""
    by_line: dict[int, list] = {}
    for call in trace.backward_calls:
        if call.retain_graph and call.error is None and call.reached:
            by_line.setdefault(cell_line(call.site), []).append(call)
    findings = []
    for line, calls in by_line.items():
        kept = graph.buffers_of({n for c in calls for n in c.reached}, live=True)
        nbytes = retained_bytes_of(kept)
        if not nbytes:
            continue
        holder = _root_name(trace, calls[-1].root_ids)
        times = f" (called {len(calls)} times)" if len(calls) > 1 else ""
        keeper = f" as long as `{holder}` is alive" if holder else " until the graph is dropped"
        message = (
            f"backward(retain_graph=True) at {calls[-1].site.describe()}{times}"
            f"{_quoted(calls[-1].site)} kept "
            f"{format_bytes(nbytes)} of saved tensors ({len(kept)} buffers, saved at line "
            f"{_lines(cell_line(b.saved_site) for b in kept)}) that no later backward released; "
            f"they stay in memory{keeper}. If you backpropagate once, drop retain_graph=True; "
            f"for several losses, sum them and call backward once."
        )
        related = tuple(sorted({cell_line(b.saved_site) for b in kept}))
        findings.append(Finding("retained-graph", message, line, related, holder, nbytes))
    return findings


def backward_through_freed(trace: Trace, graph: _Graph) -> list[Finding]:
    """A backward that needed buffers an earlier backward had already released."""
    findings = []
    for call in trace.backward_calls:
        if call.error is None or _FREED_TWICE not in call.error:
            continue
        freed = [b for b in graph.buffers_of(call.reached, live=False) if b.freed]
        releasers = sorted(
            {
                cell_line(c.site)
                for b in freed
                for c in trace.backward_calls
                if c.end_seq is not None and c.seq < (b.freed_seq or 0) <= c.end_seq
            }
        )
        built = [graph.node(b.node_id) for b in freed if b.node_id is not None]
        built_sites = [n.born_site for n in built if n is not None]
        findings.append(_freed_twice_finding(trace, graph, call, releasers, built_sites))
    return findings


def _freed_twice_finding(
    trace: Trace, graph: _Graph, call, releasers: list[int], built_sites: list[Site]
) -> Finding:
    name = _root_name(trace, call.root_ids)
    who = f"`{name}.backward()`" if name else "The backward"
    built_lines = sorted({cell_line(s) for s in built_sites})
    built = f" saved at line {_lines(built_lines)}" if built_lines else ""
    earlier = f"the backward at line {_lines(releasers)}" if releasers else "an earlier backward"
    carried = [s for s in built_sites if _built_in_two_epochs(trace, graph, s)]
    if carried:
        fix = (
            f"The shared part is a value carried across iterations (line {cell_line(carried[0])}):"
            " detach it once per iteration (`h = h.detach()`) rather than passing "
            "retain_graph=True, which would keep every iteration's graph alive."
        )
    else:
        fix = (
            f"Passing retain_graph=True at line {_lines(releasers) or '?'} would keep them (and "
            "their memory) until this call; the usual better fix is one backward over the sum, "
            "e.g. `(loss1 + loss2).backward()`."
        )
    message = (
        f"{who} at {call.site.describe()} needs tensors{built} that {earlier} already freed (a "
        f"backward frees the saved tensors of the graph it walks). {fix}"
    )
    related = tuple(sorted(set(releasers) | set(built_lines)))
    line = cell_line(call.site)
    return Finding("backward-through-freed", message, line, related, name, 0)


def _built_in_two_epochs(trace: Trace, graph: _Graph, site: Site) -> bool:
    epochs = {graph.epoch(n.born_seq) for n in trace.nodes if n.born_site == site}
    return len(epochs) > 1


# ----- writes ----------------------------------------------------------------------------
def _saved_description(graph: _Graph, bump: VersionBump) -> tuple[str, tuple[int, ...]]:
    buffers = [b for b in map(graph.trace.buffer, bump.hit_buffers) if b is not None]
    owners = sorted({n.name for b in buffers if b.node_id and (n := graph.node(b.node_id))})
    lines = tuple(sorted({cell_line(b.saved_site) for b in buffers}))
    who = " and ".join(owners) if owners else "autograd"
    return f"{who} saved for backward at line {_lines(lines)}", lines


def inplace_on_saved(trace: Trace, graph: _Graph) -> list[Finding]:
    """In-place writes to a tensor a live graph saved: the next backward through it will fail."""
    findings, seen = [], set()
    for bump in trace.version_bumps:
        key = (cell_line(bump.site), bump.label)
        if not bump.hit_buffers or bump.bypass or key in seen:
            continue
        seen.add(key)
        saved, lines = _saved_description(graph, bump)
        optimizer = bump.op.startswith("_foreach") or "step(" in source_of(bump.site)
        if optimizer:
            fix = (
                "The optimizer updated the weights while a retained graph still needs their old "
                "values: run every backward before optimizer.step(), or redo the forward after it."
            )
        else:
            fix = (
                "Use the out-of-place form (`x = x + 1`, `torch.relu(x)` / inplace=False), or "
                "`.clone()` the tensor before writing to it."
            )
        message = (
            f"In-place `{bump.op}` on `{bump.label}` at line {key[0]}{_quoted(bump.site)} changed "
            f"a tensor that {saved}; a backward through that graph will fail with "
            f"{_INPLACE_ERROR}. {fix}"
        )
        findings.append(Finding("inplace-on-saved", message, key[0], lines, bump.label, 0))
    return findings


def shared_write(trace: Trace, graph: _Graph) -> list[Finding]:
    """In-place writes that also change another live tensor or array sharing the memory."""
    how = {}
    for group in trace.storage_groups():
        how.update(group.how)
    findings, seen = [], set()
    for bump in trace.version_bumps:
        key = (cell_line(bump.site), bump.label)
        if not bump.sharers or "#" in bump.label or key in seen:
            continue
        seen.add(key)
        others = ", ".join(
            f"`{s}`" + (f" ({how[s]})" if how.get(s, "original") != "original" else "")
            for s in bump.sharers
        )
        message = (
            f"In-place `{bump.op}` on `{bump.label}` at line {key[0]}{_quoted(bump.site)} also "
            f"changed {others}: they share memory with `{bump.label}`. If the old values were "
            f"meant to stay, copy first with `.clone()` (tensors) or `.copy()` (NumPy arrays)."
        )
        findings.append(Finding("shared-write", message, key[0], (), bump.label, 0))
    return findings


def data_bypass(trace: Trace, graph: _Graph) -> list[Finding]:
    """Writes through `.data` or NumPy to memory autograd saved, invisible to its version check."""
    findings = []
    for bump in trace.version_bumps:
        if not (bump.bypass and bump.hit_buffers):
            continue
        saved, lines = _saved_description(graph, bump)
        line = cell_line(bump.site)
        target = f"`{bump.bypassed}`" if bump.bypassed else "a tensor"
        if bump.op == "numpy write":
            how = f"NumPy array `{bump.label}` was written (seen at line {line})"
        else:
            written = f"{bump.bypassed}.data" if "#" in bump.label else bump.label
            how = f"`{written}` was written at line {line}{_quoted(bump.site)} through `.data`"
        message = (
            f"{how}, changing {target} without bumping its version counter, after {saved}: "
            f"backward will use the new values without any error, so gradients may be silently "
            f"wrong. Make the change before the forward pass, or write under torch.no_grad() "
            f"without `.data` so autograd's check can see it."
        )
        findings.append(Finding("data-bypass", message, line, lines, bump.bypassed or None, 0))
    return findings


# ----- unused-graph ----------------------------------------------------------------------
def unused_graph(trace: Trace, graph: _Graph) -> list[Finding]:
    """Graphs built with saved tensors that no backward ever used (e.g. inference with grad on)."""
    unused = {
        n.id: n
        for n in trace.nodes
        if n.reached_by is None and not n.existed_before and n.name != _ACCUMULATE
    }
    children = {c for n in unused.values() for c in n.next_ids}
    roots = [n for n in unused.values() if n.id not in children]
    by_line: dict[int, list[NodeRecord]] = {}
    for root in roots:
        by_line.setdefault(cell_line(root.born_site), []).append(root)
    no_backward = not trace.backward_calls
    findings = []
    for line, line_roots in by_line.items():
        freed = [r for r in line_roots if not r.alive]
        if not (no_backward or freed):
            continue
        per_graph = [_unused_bytes(graph, r, unused) for r in line_roots]
        if not any(per_graph):
            continue
        findings.append(_unused_finding(trace, line, line_roots, freed, max(per_graph)))
    return findings


def _unused_bytes(graph: _Graph, root: NodeRecord, unused: dict[int, NodeRecord]) -> int:
    seen, stack = set(), [root.id]
    while stack:
        node_id = stack.pop()
        if node_id in seen or node_id not in unused:
            continue
        seen.add(node_id)
        stack.extend(unused[node_id].next_ids)
    return retained_bytes_of(graph.buffers_of(seen, live=False))


def _unused_finding(
    trace: Trace, line: int, roots: list[NodeRecord], freed: list[NodeRecord], peak: int
) -> Finding:
    site = roots[0].born_site
    if not trace.backward_calls:
        message = (
            f"Line {line}{_quoted(site)} built {len(roots)} autograd graph"
            f"{'s' if len(roots) > 1 else ''} that no backward used, saving up to "
            f"{format_bytes(peak)} of tensors each for a backward that never came. For inference, "
            f"run it under `with torch.no_grad():` (or `torch.inference_mode()`); if you call "
            f"backward later, in another cell, ignore this."
        )
        return Finding("unused-graph", message, line, (), None, peak)
    freed_at = Counter(cell_line(r.freed_site) for r in freed if r.freed_site is not None)
    where = freed_at.most_common(1)[0][0] if freed_at else None
    when = (
        f", most at line {where}, when the value holding it was rebound or dropped" if where else ""
    )
    message = (
        f"{len(roots)} graph{'s' if len(roots) > 1 else ''} built at line {line}"
        f"{_quoted(site)} never reached a backward; each was freed with its output{when}, "
        f"holding up to {format_bytes(peak)} of saved tensors until then. If you only need "
        f"those values, compute them under `torch.no_grad()`."
    )
    related = tuple(sorted(set(freed_at) - {line}))
    return Finding("unused-graph", message, line, related, None, peak)


_ANALYSES: tuple[Callable[[Trace, _Graph], list[Finding]], ...] = (
    kept_alive,
    graph_growth,
    retained_graph,
    backward_through_freed,
    inplace_on_saved,
    shared_write,
    data_bypass,
    unused_graph,
)


def analyze(trace: Trace) -> list[Finding]:
    """All findings for a finished trace, in the order of the lines they point at."""
    graph = _Graph(trace)
    findings = [f for analysis in _ANALYSES for f in analysis(trace, graph)]
    growing = {f.holder for f in findings if f.kind == "graph-growth"}
    findings = [f for f in findings if not (f.kind == "kept-alive" and f.holder in growing)]
    return sorted(findings, key=lambda f: (f.line or 0, KINDS.index(f.kind)))
