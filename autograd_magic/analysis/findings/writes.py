"""Facts about writes: inplace-on-saved (one per write, or one per optimizer step),
shared-write and data-bypass."""

from __future__ import annotations

from autograd_magic.analysis.findings.facts import (
    Bypass,
    DataWrite,
    GraphGrowth,
    InplaceWrite,
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
    written_name,
)
from autograd_magic.analysis.index import RecordIndex
from autograd_magic.analysis.storage import storage_groups
from autograd_magic.model.records import VersionBump
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import cell_line, layer_pattern


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
) -> list[InplaceWrite | OptimizerStep]:
    """In-place writes to a tensor a live graph saved: the next backward through it will fail.
    One optimizer step that updates many saved parameters is one fact naming them all; `cause`
    is the graph-growth fact that makes the next backward reach the updated tensors."""
    facts: list[InplaceWrite | OptimizerStep] = []
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
        facts.append(
            InplaceWrite(
                line=line,
                related_lines=tuple(sorted({*saved.lines, key[0]} - {line})),
                holder=local or bump.label,
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
        holder=stepped_object(site) or bumps[0].label,
        cause=cause,
        reference=site,
        buffer_ids=buffer_ids,
        labels=tuple(b.label for b in bumps),
        saved=saved,
        failed=_failed_after(trace, bumps[0]),
    )


def shared_write(trace: Trace, graph: RecordIndex) -> list[SharedWrite]:
    """In-place writes that also change another live tensor or array sharing the memory."""
    how: dict[str, str] = {}
    for group in storage_groups(trace.links, trace.labels, trace.alive_at_end):
        how.update(group.how)
    facts: list[SharedWrite] = []
    seen = set()
    file = traced_path(trace)
    for bump in trace.version_bumps:
        label, sharers = bump.label, bump.sharers
        if bump.bypass and bump.bypassed and "#" in label:  # a write through `a.data`
            label = f"{bump.bypassed}.data"
            sharers = tuple(s for s in sharers if s != bump.bypassed)
        key = (own_line(bump.site, file), label)
        if not sharers or "#" in label or key in seen:
            continue
        seen.add(key)
        others = tuple(
            (s, how[s] if how.get(s, "original") != "original" else None) for s in sharers
        )
        related = tuple({cell_line(bump.site)} - {key[0]})
        facts.append(
            SharedWrite(
                line=key[0],
                related_lines=related,
                holder=label,
                reference=bump.site,
                op=bump.op,
                sharers=others,
            )
        )
    return facts


def data_bypass(trace: Trace, graph: RecordIndex) -> list[Bypass]:
    """Writes through `.data` or NumPy to memory autograd saved, invisible to its version check:
    one fact per line (a loop writing each batch's tensor is one mistake), naming the last
    tensor it wrote, at the line inside the user's function that wrote it (see `own_line`)."""
    facts: list[Bypass] = []
    seen = set()
    file = traced_path(trace)
    for bump in reversed(trace.version_bumps):
        if not (bump.bypass and bump.hit_buffers):
            continue
        numpy = bump.op == "numpy write"
        line = own_line(bump.site, file)
        if (line, numpy) in seen:
            continue
        seen.add((line, numpy))
        written = bump.label if numpy or "#" not in bump.label else f"{bump.bypassed}.data"
        saved, buffer_ids = saved_by(graph, [bump], file)
        facts.append(
            (NumpyWrite if numpy else DataWrite)(
                line=line,
                related_lines=tuple(sorted({*saved.lines, cell_line(bump.site)} - {line})),
                holder=bump.bypassed or None,
                reference=bump.site,
                buffer_ids=buffer_ids,
                written=written,
                saved=saved,
            )
        )
    return facts[::-1]
