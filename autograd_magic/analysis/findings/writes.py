"""Findings about writes: inplace-on-saved, shared-write and data-bypass."""

from __future__ import annotations

import re

from autograd_magic.analysis.findings.common import (
    INPLACE_ERROR,
    RecordIndex,
    because,
    line_list,
    name_list,
    quoted_source,
    source_of,
)
from autograd_magic.model.records import Finding, VersionBump
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import cell_line

# ----- writes ----------------------------------------------------------------------------
_LAYER = re.compile(r"(?<=\.)\d+(?=\.|$)")  # a layer number in a module path: `h.3.attn`


def _saved_description(graph: RecordIndex, bumps: list[VersionBump]) -> tuple[str, tuple[int, ...]]:
    hit = [i for bump in bumps for i in bump.hit_buffers]
    buffers = [b for b in map(graph.trace.buffer, hit) if b is not None]
    owners = sorted({n.name for b in buffers if b.node_id and (n := graph.node(b.node_id))})
    lines = tuple(sorted({cell_line(b.saved_site) for b in buffers}))
    who = " and ".join(owners) if owners else "autograd"
    modules = sorted({b.module for b in buffers if b.module})
    if len(modules) >= 3:  # repeated layers read as one; a Sequential's two children do not
        modules = sorted({_LAYER.sub("*", m) for m in modules})
    if modules:
        # Inside a model the line is the one calling `model(...)`: the module says where.
        who += f" (in {name_list((f'`{m}`' for m in modules), 'modules')})"
    return f"{who} saved for backward at line {line_list(lines)}", lines


def inplace_on_saved(trace: Trace, graph: RecordIndex) -> list[Finding]:
    """In-place writes to a tensor a live graph saved: the next backward through it will fail.
    One optimizer step that updates many saved parameters is one finding naming them all."""
    findings, seen = [], set()
    steps: dict[int, list[VersionBump]] = {}
    for bump in trace.version_bumps:
        key = (cell_line(bump.site), bump.label)
        if not bump.hit_buffers or bump.bypass or key in seen:
            continue
        seen.add(key)
        if bump.op.startswith("_foreach") or "step(" in source_of(bump.site):
            steps.setdefault(key[0], []).append(bump)
            continue
        saved, lines = _saved_description(graph, [bump])
        message = (
            f"In-place `{bump.op}` on `{bump.label}` at line {key[0]}"
            f"{quoted_source(bump.site)} changed a tensor that {saved}; a backward through that "
            f"graph will fail with {INPLACE_ERROR}. Use the out-of-place form (`x = x + 1`, "
            f"`torch.relu(x)` / inplace=False), or `.clone()` the tensor before writing to it."
        )
        findings.append(Finding("inplace-on-saved", message, key[0], lines, bump.label, 0))
    findings += [_optimizer_step(graph, line, bumps) for line, bumps in steps.items()]
    return findings


def _optimizer_step(graph: RecordIndex, line: int, bumps: list[VersionBump]) -> Finding:
    """One finding for every saved parameter one optimizer step updated."""
    site = bumps[0].site
    saved, lines = _saved_description(graph, bumps)
    names = name_list((b.label for b in bumps), "parameters")
    what = f"`{names}`" if len(bumps) == 1 else names
    match = re.search(r"([\w.]+)\.step\(", source_of(site))
    holder = match.group(1) if match else bumps[0].label
    done = (
        f"the optimizer step at line {line}{quoted_source(site)} updated {what} in place, "
        f"tensors that {saved}"
    )
    if graph.carried is not None:
        message = (
            f"{because(graph)}the next backward reaches back into that graph: {done}, so it "
            f"fails with {INPLACE_ERROR}. Detaching `{graph.carried[0]}` fixes this too."
        )
    else:
        message = (
            f"{done[0].upper()}{done[1:]}; a backward through that graph will fail with "
            f"{INPLACE_ERROR}. The "
            f"optimizer updated the weights while a retained graph still needs their old "
            f"values: run every backward before optimizer.step(), or redo the forward after it."
        )
    finding = Finding("inplace-on-saved", message, line, lines, holder, 0)
    if graph.carried is not None:
        graph.consequences.append(finding)
    return finding


def shared_write(trace: Trace, graph: RecordIndex) -> list[Finding]:
    """In-place writes that also change another live tensor or array sharing the memory."""
    how = {}
    for group in trace.storage_groups():
        how.update(group.how)
    findings, seen = [], set()
    for bump in trace.version_bumps:
        label, sharers = bump.label, bump.sharers
        if bump.bypass and bump.bypassed and "#" in label:  # a write through `a.data`
            label = f"{bump.bypassed}.data"
            sharers = tuple(s for s in sharers if s != bump.bypassed)
        key = (cell_line(bump.site), label)
        if not sharers or "#" in label or key in seen:
            continue
        seen.add(key)
        others = ", ".join(
            f"`{s}`" + (f" ({how[s]})" if how.get(s, "original") != "original" else "")
            for s in sharers
        )
        message = (
            f"In-place `{bump.op}` on `{label}` at line {key[0]}"
            f"{quoted_source(bump.site)} also changed {others}, which "
            f"{'share' if len(sharers) > 1 else 'shares'} memory with `{label}`. "
            f"If the old values were "
            f"meant to stay, copy first with `.clone()` (tensors) or `.copy()` (NumPy arrays)."
        )
        findings.append(Finding("shared-write", message, key[0], (), label, 0))
    return findings


def data_bypass(trace: Trace, graph: RecordIndex) -> list[Finding]:
    """Writes through `.data` or NumPy to memory autograd saved, invisible to its version check."""
    findings = []
    for bump in trace.version_bumps:
        if not (bump.bypass and bump.hit_buffers):
            continue
        saved, lines = _saved_description(graph, [bump])
        line = cell_line(bump.site)
        target = f"`{bump.bypassed}`" if bump.bypassed else "a tensor"
        if bump.op == "numpy write":
            how = f"NumPy array `{bump.label}` was written (seen at line {line})"
        else:
            written = f"{bump.bypassed}.data" if "#" in bump.label else bump.label
            how = (
                f"`{written}` was written at line {line}{quoted_source(bump.site)} through `.data`"
            )
        message = (
            f"{how}, changing {target} without bumping its version counter, after {saved}: "
            f"backward will use the new values without any error, so gradients may be silently "
            f"wrong. Make the change before the forward pass, or write under torch.no_grad() "
            f"without `.data` so autograd's check can see it."
        )
        findings.append(Finding("data-bypass", message, line, lines, bump.bypassed or None, 0))
    return findings
