"""Findings about graph lifetime: kept-alive, graph-growth, retained-graph,
backward-through-freed and unused-graph."""

from __future__ import annotations

import linecache
import re
from collections import Counter

from autograd_magic.analysis.findings.common import (
    FREED_TWICE,
    RecordIndex,
    because,
    line_list,
    quoted_code,
    quoted_source,
    retained_bytes_of,
    source_of,
)
from autograd_magic.model.records import Finding, NodeRecord, Site
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import ACCUMULATE_GRAD, cell_line, format_bytes


# ----- kept-alive -------------------------------------------------------------------------
def _holder_group(path: str) -> str:
    """`losses[3]` -> `losses`: elements of one container are reported together."""
    return path.split("[", 1)[0] if "[" in path else path


def kept_alive(trace: Trace, graph: RecordIndex) -> list[Finding]:
    """User variables, container elements or attributes keeping graphs alive past their use."""
    groups: dict[str, list[NodeRecord]] = {}
    for holder in trace.holders:
        node = graph.node(holder.node_id)
        if node is not None and node.alive and node.name != ACCUMULATE_GRAD:
            groups.setdefault(_holder_group(holder.path), []).append(node)
    findings = []
    for path, roots in groups.items():
        finding = _kept_alive_chain(path, roots[0], graph) if len(roots) == 1 else None
        if finding is None and ("[" in path or "." in path or len(roots) > 1):
            finding = _kept_alive_container(path, roots, graph)
        if finding is not None:
            findings.append(finding)
    return findings


def _kept_alive_chain(path: str, root: NodeRecord, graph: RecordIndex) -> Finding | None:
    """A plain variable that adds each iteration's loss to itself (`total_loss += loss`)."""
    nodes = graph.live_reach([root.id])
    # Links made by an accumulator are never walked by a backward; a carried state's links are
    # (graph-growth and backward-through-freed report those).
    same_line = [
        n
        for n in map(graph.node, nodes)
        if n is not None
        and n.name != ACCUMULATE_GRAD
        and n.born_site == root.born_site
        and n.reached_by is None
    ]
    epochs = {graph.epoch(n.born_seq) for n in same_line}
    if len(same_line) < 2 or len(epochs) < 2:
        return None
    nbytes = retained_bytes_of(graph.buffers_of(nodes, live=True))
    line = cell_line(root.born_site)
    message = (
        f"`{path}` keeps every iteration's graph alive: line {line}{quoted_source(root.born_site)} "
        f"adds each new result to it, so {len(epochs):,} iterations' graphs ({len(nodes):,} nodes"
        f"{', ' + format_bytes(nbytes) + ' saved' if nbytes else ''}) are chained together and "
        f"never freed. Accumulate a number instead: `{path} += loss.item()` (or `loss.detach()`)."
    )
    return Finding("kept-alive", message, line, (), path, nbytes)


def _kept_alive_container(path: str, roots: list[NodeRecord], graph: RecordIndex) -> Finding | None:
    """Container elements or object attributes holding graphs after a backward used them."""
    nodes = graph.live_reach(n.id for n in roots)
    if all((n := graph.node(i)) is not None and n.name == ACCUMULATE_GRAD for i in nodes):
        return None
    used = any((n := graph.node(i)) is not None and n.reached_by is not None for i in nodes) or any(
        graph.epoch(r.born_seq) < len(graph.backward_seqs) for r in roots
    )
    nbytes = retained_bytes_of(graph.buffers_of(nodes, live=True))
    grows = len({graph.epoch(r.born_seq) for r in roots}) > 1 or (not used and len(roots) > 1)
    # The last iteration's own result holding its own, already released graph is normal.
    if not grows and not (used and nbytes):
        return None
    first = min(roots, key=lambda n: n.born_seq)
    computed = cell_line(first.born_site)
    line = _reference_line(graph.trace, path, computed)
    saved = (
        f", {format_bytes(nbytes)} of saved tensors"
        if nbytes
        else "; a backward already released their saved tensors, so only the nodes remain"
    )
    what = (
        f"{len(roots):,} tensors that still carry their autograd graphs"
        if len(roots) > 1
        else "a tensor that still carries its autograd graph"
    )
    taken = f"line {line}{_quoted_line(graph.trace, line)} keeps " if line != computed else ""
    message = (
        f"`{path}` holds {what} ({len(nodes):,} nodes{saved}): {taken}what line {computed}"
        f"{quoted_source(first.born_site)} computed; the graphs stay in memory as long as "
        f"`{path}` does. Keep `.item()` or `.detach()` of the value instead of the tensor itself."
    )
    related = tuple(sorted({cell_line(r.born_site) for r in roots} - {line}))
    return Finding("kept-alive", message, line, related, path, nbytes)


def _traced_file(trace: Trace) -> tuple[str, int, int] | None:
    """The traced code's file and the first and last of its lines that the trace saw."""
    sites = [n.born_site for n in trace.nodes] + [c.site for c in trace.backward_calls]
    sites += [b.site for b in trace.version_bumps]
    top = [s for s in sites if s.outer_line is None and s.line > 0]
    if not top:
        return None
    file = Counter(s.file for s in top).most_common(1)[0][0]
    lines = [s.line for s in top if s.file == file]
    return file, min(lines), max(lines)


def _reference_line(trace: Trace, path: str, computed: int) -> int:
    """The traced line that stores into the container `path` (`losses.append(loss)`), else
    `computed`. Read from the source, since storing into a list is no autograd event."""
    if "[" in path or "." in path or (found := _traced_file(trace)) is None:
        return computed
    file, first, last = found
    store = re.compile(
        rf"(?<![\w.]){re.escape(path)}\s*(\.(append|extend|insert|add)\(|\[[^\]]*\]\s*=[^=]|\+=)"
    )
    hits = [
        n
        for n in range(first, last + 10)
        if store.search(linecache.getline(file, n).split("#", 1)[0])
    ]
    after = [n for n in hits if n >= computed]
    return (after or hits or [computed])[0]


def _quoted_line(trace: Trace, line: int) -> str:
    found = _traced_file(trace)
    text = linecache.getline(found[0], line).strip() if found else ""
    return f" (`{text}`)" if text else ""


# ----- graph-growth, retained-graph, backward-through-freed -----------------------------
def graph_growth(trace: Trace, graph: RecordIndex) -> list[Finding]:
    """A value carried across iterations links each new graph to the one an earlier backward
    walked: the root cause of a growing graph, of retain_graph=True and of the optimizer error."""
    calls = [c for c in trace.backward_calls if c.earlier_nodes > 0 and not _freed_twice(c)]
    if not calls:
        return []
    carried = _carried_sites(trace, graph)
    if not carried:
        return []
    site = carried.most_common(1)[0][0]
    line = cell_line(site)
    holder = _carried_holder(trace, graph, site) or "the carried value"
    retain = any(c.retain_graph for c in trace.backward_calls)
    ok = [c for c in calls if c.error is None]
    grew = (
        f", and the graph grew from {ok[0].graph_nodes} to {ok[-1].graph_nodes} nodes over "
        f"{len(ok) + 1:,} backward calls"
        if len(ok) > 1 and ok[-1].graph_nodes > ok[0].graph_nodes
        else ""
    )
    message = (
        f"Each iteration's graph links to the previous one through `{holder}`, carried at line "
        f"{line}{quoted_source(site)}: the backward at line {cell_line(calls[-1].site)} walked "
        f"{calls[-1].earlier_nodes} nodes from earlier iterations{grew}. Detach the carried "
        f"value once per iteration, before it is used again: `{_detached(trace, holder)}`"
        + _once_detached(retain, any(b.hit_buffers for b in trace.version_bumps))
    )
    related = tuple(sorted({cell_line(c.site) for c in calls} - {line}))
    graph.carried = (holder, line)
    return [Finding("graph-growth", message, line, related, holder, trace.peak_retained_bytes)]


def _once_detached(retain: bool, writes_hit_saved: bool) -> str:
    """What detaching also fixes: the retain_graph workaround, and in-place updates (an
    optimizer step) that broke the next backward, each only when it happened."""
    if not retain:
        return "."
    if writes_hit_saved:
        return (
            "; then retain_graph=True is no longer needed and the optimizer's updates no longer "
            "break the next backward."
        )
    return "; then retain_graph=True is no longer needed."


def _freed_twice(call) -> bool:
    return call.error is not None and FREED_TWICE in call.error


def _carried_sites(trace: Trace, graph: RecordIndex) -> Counter[Site]:
    """Sites of values that an earlier backward walked and a later iteration consumed again."""
    carried: Counter[Site] = Counter()
    first_walk: dict[int, int] = {}
    site_epochs: dict[Site, set[int]] = {}
    for node in trace.nodes:
        site_epochs.setdefault(node.born_site, set()).add(graph.epoch(node.born_seq))
    for node in trace.nodes:
        epoch = graph.epoch(node.born_seq)
        if node.reached_by is None:  # an accumulator (`total += loss`) no backward walks
            continue
        for child_id in node.next_ids:
            child = graph.node(child_id)
            if (
                child is not None
                and child.name != ACCUMULATE_GRAD
                and not child.existed_before
                and graph.epoch(child.born_seq) < epoch
                # A value fed forward before any backward walked its graph (a GAN's `fake`) is
                # one iteration's graph, not a carried one.
                and _first_walk(graph, child.id, first_walk) < epoch
                # The line that made it ran again in this iteration (`h = rnn(x, h)`): not one
                # forward feeding two backwards one after the other.
                and epoch in site_epochs[child.born_site]
            ):
                carried[child.born_site] += 1
    return carried


def _first_walk(graph: RecordIndex, root_id: int, memo: dict[int, int]) -> int:
    """The first backward that walked any node under `root_id` (a large number if none did)."""
    never = len(graph.backward_seqs) + 1
    stack = [root_id]
    while stack:
        node_id = stack[-1]
        node = graph.node(node_id)
        if node_id in memo or node is None or node.name == ACCUMULATE_GRAD:
            memo.setdefault(node_id, never)
            stack.pop()
            continue
        todo = [c for c in node.next_ids if c not in memo]
        if todo:
            stack.extend(todo)
            continue
        own = never if node.reached_by is None else node.reached_by
        memo[node_id] = min([own, *(memo[c] for c in node.next_ids)])
        stack.pop()
    return memo[root_id]


def _carried_holder(trace: Trace, graph: RecordIndex, site: Site) -> str | None:
    """The variable computed at `site` that its own line also reads (`h = rnn(x, h)`)."""
    names = []
    for holder in trace.holders:
        node = graph.node(holder.node_id)
        if node is not None and node.born_site == site:
            names.append(_holder_group(holder.path))
    text = source_of(site)
    for name in names:
        if len(re.findall(rf"(?<![\w.]){re.escape(name)}(?![\w])", text)) >= 2:
            return name
    return names[0] if names else None


def _detached(trace: Trace, holder: str) -> str:
    """`h = h.detach()`, or the tuple form when `holder` is a tuple such as an LSTM's (h, c)."""
    if any(h.path.startswith(f"{holder}[") for h in trace.holders):
        return f"{holder} = tuple(t.detach() for t in {holder})"
    return f"{holder} = {holder}.detach()"


def _root_name(trace: Trace, root_ids: tuple[int, ...]) -> str | None:
    names = {h.node_id: h.path for h in trace.holders}
    for node_id in root_ids:
        if node_id in names:
            return names[node_id]
    return None


def retained_graph(trace: Trace, graph: RecordIndex) -> list[Finding]:
    """`retain_graph=True` calls whose kept buffers no later backward released."""
    by_line: dict[int, list] = {}
    for call in trace.backward_calls:
        if call.retain_graph:
            by_line.setdefault(cell_line(call.site), []).append(call)
    findings = []
    for line, every in by_line.items():
        calls = [c for c in every if c.error is None and c.reached]
        kept = graph.buffers_of({n for c in calls for n in c.reached}, live=True)
        nbytes = retained_bytes_of(kept)
        if not nbytes:
            continue
        holder = _root_name(trace, calls[-1].root_ids)
        # Every call counts, the one that raised too: the user ran the line that many times.
        times = f" (called {len(every):,} times)" if len(every) > 1 else ""
        keeper = f" as long as `{holder}` is alive" if holder else " until the graph is dropped"
        kept_text = (
            f"{format_bytes(nbytes)} of saved tensors ({len(kept):,} buffers, saved at line "
            f"{line_list(cell_line(b.saved_site) for b in kept)}) that no later backward released; "
            f"they stay in memory{keeper}."
        )
        call_text = f"{calls[-1].site.describe()}{times}{quoted_code(calls[-1].site)}"
        if graph.carried is not None:
            message = (
                f"{because(graph)}each backward reaches back into it, which is why "
                f"backward(retain_graph=True) at {call_text} seemed needed. It kept {kept_text} "
                f"Once `{graph.carried[0]}` is detached, drop retain_graph=True."
            )
        else:
            message = (
                f"backward(retain_graph=True) at {call_text} kept {kept_text} If you "
                f"backpropagate once, drop retain_graph=True; for several losses, sum them and "
                f"call backward once."
            )
        related = tuple(sorted({cell_line(b.saved_site) for b in kept}))
        finding = Finding("retained-graph", message, line, related, holder, nbytes)
        if graph.carried is not None:
            graph.consequences.append(finding)
        findings.append(finding)
    return findings


def backward_through_freed(trace: Trace, graph: RecordIndex) -> list[Finding]:
    """A backward that needed buffers an earlier backward had already released."""
    findings = []
    for index, call in enumerate(trace.backward_calls):
        if call.error is None or FREED_TWICE not in call.error:
            continue
        shared = _walked_before(trace, graph, call, index)
        releaser = _releaser(trace, shared, index)
        findings.append(_freed_twice_finding(trace, graph, call, shared, releaser))
    return findings


def _walked_before(trace: Trace, graph: RecordIndex, call, index: int) -> list[NodeRecord]:
    """Nodes the failing call needed that an earlier backward had walked: the shared part."""
    nodes = (graph.node(i) for i in call.reached)
    return sorted(
        (
            n
            for n in nodes
            if n is not None
            and n.name != ACCUMULATE_GRAD
            and n.reached_by is not None
            and n.reached_by < index
        ),
        key=lambda n: n.born_seq,
    )


def _releaser(trace: Trace, shared: list[NodeRecord], index: int):
    """The first earlier backward without retain_graph that could have freed the shared part."""
    first = min((n.reached_by for n in shared if n.reached_by is not None), default=0)
    for call in trace.backward_calls[first:index]:
        if not call.retain_graph and call.error is None:
            return call
    return None


def _freed_twice_finding(
    trace: Trace, graph: RecordIndex, call, shared: list[NodeRecord], releaser
) -> Finding:
    name = _root_name(trace, call.root_ids)
    who = f"`{name}.backward()`" if name else "The backward"
    built_lines = sorted({cell_line(n.born_site) for n in shared})
    freed = [
        b
        for b in graph.buffers_of((n.id for n in shared), live=False)
        if b.freed and (b.freed_seq or 0) < call.seq
    ]
    saved_lines = sorted({cell_line(b.saved_site) for b in freed}) or built_lines
    if freed:
        needs = f"tensors saved at line {line_list(saved_lines)}"
    else:  # e.g. a Python number saved by `2 * x`: saved-tensor hooks never see those
        needs = f"the graph built at line {line_list(built_lines)}" if built_lines else "a graph"
    if releaser is None:
        earlier, releaser_lines = "an earlier backward", []
    else:
        again = " (an earlier run of that line)" if releaser.site == call.site else ""
        earlier = f"the backward at {releaser.site.describe()}{again}"
        releaser_lines = [cell_line(releaser.site)]
    message = (
        f"{who} at {call.site.describe()} needs {needs} that {earlier} already freed (a backward "
        f"frees the saved tensors of the graph it walks). "
        f"{_freed_twice_fix(trace, graph, call, shared, releaser, name)}"
    )
    related = tuple(sorted(set(releaser_lines) | set(built_lines) | set(saved_lines)))
    return Finding("backward-through-freed", message, cell_line(call.site), related, name, 0)


def _freed_twice_fix(
    trace: Trace, graph: RecordIndex, call, shared: list[NodeRecord], releaser, name: str | None
) -> str:
    """The usual fix, by how the graphs came to share a part."""
    roots = [n for n in map(graph.node, call.root_ids) if n is not None]
    if releaser is not None and roots and all(r.born_seq < releaser.seq for r in roots):
        # Two losses from one forward, backpropagated one after the other.
        first = _root_name(trace, releaser.root_ids)
        total = f"({first} + {name})" if first and name and first != name else "(loss1 + loss2)"
        return (
            f"Passing retain_graph=True at line {cell_line(releaser.site)} would keep them (and "
            f"their memory) until this call; the usual better fix is one backward over the sum, "
            f"`{total}.backward()`."
        )
    carried = [n.born_site for n in shared if _built_in_two_epochs(trace, graph, n.born_site)]
    if carried:
        holder = _carried_holder(trace, graph, carried[-1]) or "h"
        return (
            f"The shared part is a value carried across iterations (line {cell_line(carried[-1])}):"
            f" detach it once per iteration (`{_detached(trace, holder)}`) rather than passing "
            "retain_graph=True, which would keep every iteration's graph alive."
        )
    if not shared:
        return (
            "Pass retain_graph=True to the earlier backward, or sum the losses and call backward "
            "once."
        )
    widest = _widest_holder(trace, graph, shared)
    value = f"`{widest}`" if widest else "it"
    lines = line_list({cell_line(n.born_site) for n in shared})
    return (
        f"The shared part was built once (line {lines}) and is reused by every later "
        f"backward: if no gradient should flow into it, detach "
        f"{value} (or build it under `torch.no_grad()`); if one should, rebuild it before each "
        "backward."
    )


def _widest_holder(trace: Trace, graph: RecordIndex, shared: list[NodeRecord]) -> str | None:
    """The variable bound to a shared node with the most of the shared part beneath it."""
    ids = {n.id for n in shared}
    best, best_size = None, 0
    for holder in trace.holders:
        if holder.node_id not in ids:
            continue
        below = graph.reach_within(holder.node_id, ids)
        if len(below) > best_size:
            best, best_size = holder.path, len(below)
    return best


def _built_in_two_epochs(trace: Trace, graph: RecordIndex, site: Site) -> bool:
    epochs = {graph.epoch(n.born_seq) for n in trace.nodes if n.born_site == site}
    return len(epochs) > 1


# ----- unused-graph ----------------------------------------------------------------------
def unused_graph(trace: Trace, graph: RecordIndex) -> list[Finding]:
    """Graphs built with saved tensors that no backward ever used (e.g. inference with grad on)."""
    unused = {
        n.id: n
        for n in trace.nodes
        if n.reached_by is None and not n.existed_before and n.name != ACCUMULATE_GRAD
    }
    children = {c for n in unused.values() for c in n.next_ids}
    roots = [n for n in unused.values() if n.id not in children]
    by_line: dict[int, list[NodeRecord]] = {}
    for root in roots:
        by_line.setdefault(cell_line(root.born_site), []).append(root)
    no_backward = not trace.backward_calls
    fed_a_backward = {n.born_site for n in trace.nodes if n.reached_by is not None}
    findings = []
    for line, line_roots in by_line.items():
        freed = [r for r in line_roots if not r.alive]
        for root in line_roots:
            if root.alive and root.born_site in fed_a_backward:
                finding = _leftover_finding(trace, graph, root, unused)
                findings += [finding] if finding else []
        if not (no_backward or freed):
            continue
        per_graph = [_unused_bytes(graph, r, unused) for r in line_roots]
        if not any(per_graph):
            continue
        findings.append(_unused_finding(trace, line, line_roots, freed, max(per_graph)))
    return findings


_ADD = "AddBackward0"


def _leftover_finding(
    trace: Trace, graph: RecordIndex, root: NodeRecord, unused: dict[int, NodeRecord]
) -> Finding | None:
    """A variable still holding results its line made after the last backward that used them
    (a partial batch left in `total_loss`): they never reach the gradients."""
    # Only a running sum (`total_loss += loss`, an add chain on one line) is a leftover.
    holder = _root_name(trace, (root.id,)) if root.name == _ADD else None
    if holder is None:
        return None
    chain = [root]
    while previous := [
        n
        for n in map(graph.node, chain[-1].next_ids)
        if n is not None and n.id in unused and n.born_site == root.born_site and n.name == _ADD
    ]:
        chain.append(previous[0])
    if len(chain) < 2:
        return None
    part = graph.reach_within(root.id, unused)
    nbytes = retained_bytes_of(graph.buffers_of(part, live=True))
    line = cell_line(root.born_site)
    last = trace.backward_calls[-1]
    message = (
        f"`{holder}` still holds {len(chain):,} results of line {line}"
        f"{quoted_source(root.born_site)} made after the last backward (line "
        f"{cell_line(last.site)}): no backward used them, so they add nothing to the gradients "
        f"({len(part):,} nodes{', ' + format_bytes(nbytes) + ' saved' if nbytes else ''}) and "
        f"are dropped when `{holder}` is rebound. If a partial batch is left at the end of the "
        f"loop, call backward on it too."
    )
    related = (cell_line(last.site),)
    return Finding("unused-graph", message, line, related, holder, nbytes)


def _unused_bytes(graph: RecordIndex, root: NodeRecord, unused: dict[int, NodeRecord]) -> int:
    return retained_bytes_of(graph.buffers_of(graph.reach_within(root.id, unused), live=False))


def _unused_finding(
    trace: Trace, line: int, roots: list[NodeRecord], freed: list[NodeRecord], peak: int
) -> Finding:
    site = roots[0].born_site
    ids = {r.id for r in roots}
    paths = [h.path for h in trace.holders if h.node_id in ids]
    # An attribute or a container (`crit.loss` set in a forward) is the holder a user would miss.
    holder = next((p for p in paths if "." in p or "[" in p), paths[0] if paths else None)
    held = (
        f" `{holder}` still holds {'the last' if len(roots) > 1 else 'it'}."
        if holder and any(r.alive for r in roots)
        else ""
    )
    if not trace.backward_calls:
        message = (
            f"Line {line}{quoted_source(site)} built {len(roots):,} autograd graph"
            f"{'s' if len(roots) > 1 else ''} that no backward used, saving up to "
            f"{format_bytes(peak)} of tensors each for a backward that never came. For inference, "
            f"run it under `with torch.no_grad():` (or `torch.inference_mode()`); if you call "
            f"backward later, in another cell, ignore this.{held}"
        )
        return Finding("unused-graph", message, line, (), holder, peak)
    freed_at = Counter(cell_line(r.freed_site) for r in freed if r.freed_site is not None)
    where = freed_at.most_common(1)[0][0] if freed_at else None
    many = len(roots) > 1
    when = (
        f", {'most ' if many else ''}at line {where}, when the value holding it was rebound or "
        "dropped"
        if where
        else ""
    )
    message = (
        f"{len(roots):,} graph{'s' if many else ''} built at line {line}"
        f"{quoted_source(site)} never reached a backward; {'each' if many else 'it'} was freed "
        f"with its output{when}, "
        f"holding up to {format_bytes(peak)} of saved tensors until then. If you only need "
        f"those values, compute them under `torch.no_grad()`."
    )
    related = tuple(sorted(set(freed_at) - {line}))
    return Finding("unused-graph", message + held, line, related, holder, peak)
