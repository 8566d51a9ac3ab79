"""Facts about writes: inplace-on-saved (one per write, one per optimizer step, or a library
function's own write), shared-write and data-bypass (one per write, or one per manual update
step)."""

from __future__ import annotations

from autograd_magic.analysis.findings.facts import (
    Bypass,
    DataUpdate,
    DataWrite,
    GraphGrowth,
    InplaceWrite,
    LibraryWrite,
    NumpyWrite,
    OptimizerStep,
    SavedBy,
    SharedWrite,
)
from autograd_magic.analysis.findings.source import (
    enclosing_function,
    is_step_call,
    out_of_place,
    own_line,
    stepped_object,
    traced_path,
    without_data,
    written_name,
)
from autograd_magic.analysis.index import RecordIndex
from autograd_magic.analysis.storage import storage_groups
from autograd_magic.model.records import VersionBump
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import cell_line, layer_pattern


def user_label(label: str | None) -> str | None:
    """`label` when it is a user's name (`model.fc.weight`), None for the recorder's own label
    of an object no name reached (`tensor#35`, `detach#181`): a finding never shows those."""
    return None if not label or "#" in label else label


def saved_by(
    graph: RecordIndex, bumps: list[VersionBump], file: str | None = None
) -> tuple[SavedBy, tuple[int, ...]]:
    """Who saved the buffers `bumps` hit, and those buffers' ids; the lines are those inside
    the user's functions written in the traced file `file` (see `source.own_line`)."""
    hit = [i for bump in bumps for i in bump.hit_buffers]
    buffers = [b for b in map(graph.buffer, hit) if b is not None]
    owners = sorted({n.name for b in buffers if b.node_id and (n := graph.node(b.node_id))})
    lines = tuple(sorted({own_line(b.saved_site, file) for b in buffers}))
    modules = sorted({b.module for b in buffers if b.module})
    if len(modules) >= 3:  # repeated layers read as one; a Sequential's two children do not
        modules = sorted({layer_pattern(m) for m in modules})
    return SavedBy(tuple(owners), tuple(modules), lines), tuple(b.id for b in buffers)


def inplace_on_saved(
    trace: Trace, graph: RecordIndex, cause: GraphGrowth | None
) -> list[InplaceWrite | OptimizerStep | LibraryWrite]:
    """In-place writes to a tensor a live graph saved: the next backward through it will fail.
    One optimizer step that updates many saved parameters is one fact naming them all; `cause`
    is the graph-growth fact that makes the next backward reach the updated tensors."""
    facts: list[InplaceWrite | OptimizerStep | LibraryWrite] = []
    seen = set()
    steps: dict[int, list[VersionBump]] = {}
    file = traced_path(trace)
    for bump in trace.version_bumps:
        key = (cell_line(bump.site), bump.label)
        if not bump.hit_buffers or bump.bypass or key in seen:
            continue
        seen.add(key)
        if bump.op.startswith("_foreach") or is_step_call(bump.site):
            steps.setdefault(key[0], []).append(bump)
            continue
        saved, buffer_ids = saved_by(graph, [bump], file)
        # Written inside a function of the traced file (a helper, a forward): the line to fix
        # is the inner one, and a tensor only that function named is its local variable.
        line = own_line(bump.site, file)
        inner = bump.site.outer_line not in (None, bump.site.line)
        local = written_name(bump.site) if inner and "#" in bump.label else None
        if bump.hidden:
            facts.append(_library_write(trace, bump, line, key[0], saved, buffer_ids))
            continue
        facts.append(
            InplaceWrite(
                line=line,
                related_lines=tuple(sorted({*saved.lines, key[0]} - {line})),
                holder=local or user_label(bump.label),
                scope=enclosing_function(bump.site) if local else None,
                reference=bump.site,
                buffer_ids=buffer_ids,
                op=bump.op,
                saved=saved,
                fix=out_of_place(bump.site, bump.op),
                failed=_failed_after(trace, bump),
            )
        )
    facts += [
        _optimizer_step(trace, graph, line, bumps, cause)
        for line, bumps in steps.items()
        if cause is not None or _backpropagated_after(trace, graph, bumps)
    ]
    return facts


INPLACE_FAILURE = "modified by an inplace operation"  # PyTorch's error for it


def _library_write(
    trace: Trace,
    bump: VersionBump,
    line: int,
    cell: int,
    saved: SavedBy,
    buffer_ids: tuple[int, ...],
) -> LibraryWrite:
    """A write a library function made inside its body (`bump.op` names the function)."""
    module = bump.module
    return LibraryWrite(
        line=line,
        related_lines=tuple(sorted({*saved.lines, cell} - {line})),
        holder=user_label(bump.label),
        reference=bump.site,
        buffer_ids=buffer_ids,
        call=bump.op,
        module=module,
        module_type=None if module is None else trace.module_types.get(module),
        saved=saved,
        failed=_failed_after(trace, bump),
    )


def _failed_after(trace: Trace, bump: VersionBump) -> int | None:
    """The cell line of the first later backward that failed with PyTorch's in-place error,
    when one did: the write is why (its sentence then need not quote the error again)."""
    for call in trace.backward_calls:
        if call.seq > bump.seq and call.error is not None and INPLACE_FAILURE in call.error:
            return cell_line(call.site)
    return None


def _backpropagated_after(trace: Trace, graph: RecordIndex, bumps: list[VersionBump]) -> bool:
    """Whether a backward after the step walked a node whose saved tensors the step changed:
    only then does the stale graph matter (no one backpropagates through it otherwise)."""
    hit = [b for b in map(graph.buffer, (i for x in bumps for i in x.hit_buffers)) if b]
    owners = {b.node_id for b in hit}
    seq = bumps[0].seq
    return any(c.seq > seq and owners & set(c.reached) for c in trace.backward_calls)


def _optimizer_step(
    trace: Trace,
    graph: RecordIndex,
    line: int,
    bumps: list[VersionBump],
    cause: GraphGrowth | None,
) -> OptimizerStep:
    """One fact for every saved parameter one optimizer step updated."""
    site = bumps[0].site
    saved, buffer_ids = saved_by(graph, bumps)
    return OptimizerStep(
        line=line,
        related_lines=saved.lines,
        holder=stepped_object(site) or user_label(bumps[0].label),
        cause=cause,
        reference=site,
        buffer_ids=buffer_ids,
        labels=tuple(b.label for b in bumps),
        saved=saved,
        failed=_failed_after(trace, bumps[0]),
    )


def shared_write(trace: Trace, graph: RecordIndex) -> list[SharedWrite]:
    """In-place writes that also change another live tensor or array sharing the memory, one
    that may still be read: not a temporary remade each iteration (see `_stale_sharers`)."""
    how: dict[str, str] = {}
    for group in storage_groups(trace.links, trace.labels, trace.alive_at_end):
        how.update(group.how)
    made = _made_at(trace)
    stale = _stale_sharers(trace, made)
    facts: list[SharedWrite] = []
    seen = set()
    file = traced_path(trace)
    for bump in trace.version_bumps:
        label = bump.label
        pairs = [(u, s) for u, s in _sharers(trace, bump) if u not in stale]
        if bump.bypass and bump.bypassed and "#" in label:  # a write through `a.data`
            label = f"{bump.bypassed}.data"
            pairs = [(u, s) for u, s in pairs if s != bump.bypassed]
        key = (own_line(bump.site, file), label)
        if not pairs or "#" in label or key in seen:
            continue
        seen.add(key)
        named = [s for _, s in pairs if "#" not in s]
        others = tuple((s, how[s] if how.get(s, "original") != "original" else None) for s in named)
        unnamed = tuple(made[u] for u, s in pairs if "#" in s and u in made)
        if others or unnamed:
            facts.append(
                SharedWrite(
                    line=key[0],
                    related_lines=tuple({cell_line(bump.site)} - {key[0]}),
                    holder=label,
                    reference=bump.site,
                    op=bump.op,
                    sharers=others,
                    unnamed=unnamed,
                )
            )
    return facts


def _sharers(trace: Trace, bump: VersionBump) -> list[tuple[int, str]]:
    """A write's sharers as (id, label); a hand-made trace may name them only (id 0), and one
    still running has ids whose labels come at its end."""
    ids, labels = bump.sharer_ids, bump.sharers
    if not ids:
        return [(0, s) for s in labels]
    if len(labels) != len(ids):
        labels = tuple(trace.label(u) for u in ids)
    return list(zip(ids, labels, strict=True))


def _made_at(trace: Trace) -> dict[int, tuple[str, int]]:
    """How each linked tensor or array was made (`detach`, `numpy`) and at which cell line:
    its first link as the new member."""
    made: dict[int, tuple[str, int]] = {}
    for link in trace.links:
        made.setdefault(link.member, (link.how, cell_line(link.site)))
    return made


def _stale_sharers(trace: Trace, made: dict[int, tuple[str, int]]) -> set[int]:
    """Sharers nobody can read after the write: those dead by the end of the block, and those
    a line remade for each write of the same tensor (`sd = net.state_dict()`, `a = p.numpy()`
    in a loop: the last one is still alive, but each is a fresh temporary, not a snapshot)."""
    alive = trace.alive_at_end
    stale: set[int] = set()
    remade: dict[tuple[int, int, int], set[int]] = {}
    for bump in trace.version_bumps:
        for uid in bump.sharer_ids:
            if alive is not None and uid not in alive:
                stale.add(uid)
            if uid in made:
                key = (cell_line(bump.site), bump.object_id, made[uid][1])
                remade.setdefault(key, set()).add(uid)
    for uids in remade.values():
        if len(uids) > 1:
            stale |= uids
    return stale


def data_bypass(trace: Trace, graph: RecordIndex, cause: GraphGrowth | None = None) -> list[Bypass]:
    """Writes through `.data` or NumPy to memory autograd saved, invisible to its version check:
    one fact per line (a loop writing each batch's tensor is one mistake), naming the last
    tensor it wrote, at the line inside the user's function that wrote it (see `own_line`). A
    manual update step (writes after a backward walked the graph) is one fact per line, with
    `cause` when a carried value is why a later backward reaches that graph."""
    facts: list[Bypass] = []
    seen: set[tuple[int, bool]] = set()  # (line, through NumPy)
    updated: set[tuple[int, str]] = set()  # (line, what was written)
    updates: dict[int, list[VersionBump]] = {}
    file = traced_path(trace)
    for bump in reversed(trace.version_bumps):
        if not (bump.bypass and bump.hit_buffers):
            continue
        numpy = bump.op == "numpy write"
        line = own_line(bump.site, file)
        written = bump.label if numpy or "#" not in bump.label else f"{bump.bypassed}.data"
        if "#" in written:  # no user name reaches it: the wording says what it is instead
            written = ""
        if not numpy and _after_backward(trace, graph, bump):
            if (line, written) not in updated:  # one parameter rewritten in a loop: once
                updated.add((line, written))
                updates.setdefault(line, []).insert(0, bump)
            continue
        if (line, numpy) in seen:
            continue
        seen.add((line, numpy))
        saved, buffer_ids = saved_by(graph, [bump], file)
        facts.append(
            (NumpyWrite if numpy else DataWrite)(
                line=line,
                related_lines=tuple(sorted({*saved.lines, cell_line(bump.site)} - {line})),
                holder=user_label(bump.bypassed),
                reference=bump.site,
                buffer_ids=buffer_ids,
                written=written,
                saved=saved,
            )
        )
    facts.reverse()
    facts += [_data_update(graph, line, bumps, cause) for line, bumps in reversed(updates.items())]
    return facts


def _after_backward(trace: Trace, graph: RecordIndex, bump: VersionBump) -> bool:
    """Whether a backward before the write had walked a node whose saved tensor it hit: the
    graph was backpropagated and kept, so the write is an update step, not a forward's."""
    owners = {b.node_id for b in map(graph.buffer, bump.hit_buffers) if b and b.node_id}
    return any(c.seq < bump.seq and owners & set(c.reached) for c in trace.backward_calls)


def _data_update(
    graph: RecordIndex, line: int, bumps: list[VersionBump], cause: GraphGrowth | None
) -> DataUpdate:
    """One fact for every parameter one manual update line wrote through `.data`."""
    named = (user_label(b.bypassed) for b in bumps)
    labels = tuple(dict.fromkeys(n for n in named if n))
    saved, buffer_ids = saved_by(graph, bumps)
    site = bumps[0].site
    return DataUpdate(
        line=line,
        related_lines=saved.lines,
        holder=_owner(labels) if labels else None,
        cause=cause,
        reference=site,
        buffer_ids=buffer_ids,
        written=f"{labels[0]}.data" if labels else "",
        saved=saved,
        labels=labels,
        fix=without_data(site),
    )


def _owner(labels: tuple[str, ...]) -> str:
    """What `labels` belong to: their common dotted prefix (`model` for `model.rnn.weight_ih_l0`
    and `model.decoder.weight`), or the one label."""
    if len(labels) == 1:
        return labels[0]
    parts = [label.split(".") for label in labels]
    common = []
    for names in zip(*parts, strict=False):
        if len(set(names)) > 1:
            break
        common.append(names[0])
    return ".".join(common) or labels[0]
