"""The version-bumps table: in-place writes grouped per tensor, op and line, repeated layers'
tensors and an optimizer's state entries folded into one row each."""

from __future__ import annotations

import re

from autograd_magic.analysis.result import Analysis
from autograd_magic.model.records import VersionBump
from autograd_magic.model.units import layer_pattern, where
from autograd_magic.report.model import MAX_TABLE_ROWS, Table, cut_note


def versions_table(analysis: Analysis) -> Table:
    """In-place writes grouped per tensor, op and line, in order; a loop's repeated writes share
    one row ('1 -> 1001 (1,000 writes)'), and so do the same layer's tensors in repeated layers
    ('model.layers.*.weight ... (4 tensors)') and one optimizer state entry of every parameter
    (`opt.state[*]['exp_avg']`); writes that bypass the counter flagged."""
    # Grouped on the raw fields first (a long loop has 100,000 writes), in order of appearance.
    raw: dict[tuple, list[VersionBump]] = {}
    for bump in analysis.trace.version_bumps:
        fields = (
            bump.label,
            bump.op,
            bump.site,
            bump.affected,
            bump.bypass,
            bump.bypassed,
            bump.hidden,
        )
        raw.setdefault(fields, []).append(bump)
    groups: dict[tuple[str, ...], list[VersionBump]] = {}
    for bumps in sorted(raw.values(), key=lambda b: (_natural(b[0].label), b[0].seq)):
        bump = bumps[0]
        if bump.bypass:
            via = f" through {bump.bypassed}" if bump.bypassed else ""
            flag = f"BYPASS{via}: version unchanged, autograd cannot see this write"
        elif bump.hidden:  # a library function wrote it inside its body (max_norm's renorm)
            flag = f"written inside `{bump.op}`: seen as its version moving across the call"
        else:
            flag = ""
        key = (label_pattern(bump.label), bump.op, where(bump.site), ", ".join(bump.affected), flag)
        groups.setdefault(key, []).extend(bumps)
    rows = []
    for (_, op, at, affected, flag), bumps in groups.items():
        for label, members in _merged_or_split(bumps):
            hits = sum(len(b.hit_buffers) for b in members)
            row = (label, op, at, _versions(members), affected, str(hits) if hits else "", flag)
            rows.append(row)
    headers = (
        "tensor",
        "op",
        "where",
        "version",
        "aliases bumped too",
        "saved tensors hit",
        "warning",
    )
    shown = tuple(rows[:MAX_TABLE_ROWS])
    return Table("Version bumps", headers, shown, cut_note(len(rows)), headers.index("warning"))


# One optimizer step writes the same state entry of every parameter: one row per entry.
_OPTIMIZER_STATE = re.compile(r"\.state\[.*\]\[('[^']*')\]$")
_UNNAMED = re.compile(r"^tensor#\d+$")
MIN_MERGED = 3


def _merged_or_split(bumps: list[VersionBump]) -> list[tuple[str, list[VersionBump]]]:
    """One row under the pattern for `MIN_MERGED` tensors or more, else a row per tensor."""
    by_label: dict[str, list[VersionBump]] = {}
    for bump in bumps:
        by_label.setdefault(bump.label, []).append(bump)
    if len(by_label) >= MIN_MERGED:
        return [(label_pattern(bumps[0].label), bumps)]
    return list(by_label.items())


def label_pattern(label: str) -> str:
    """`model.layers.*.weight`, `opt.state[*]['exp_avg']`, `tensor#*`: what repeats shares a row."""
    label = _OPTIMIZER_STATE.sub(r".state[*][\1]", layer_pattern(label))
    return _UNNAMED.sub("tensor#*", label)


def _versions(bumps: list[VersionBump]) -> str:
    """'1 -> 2', '1 -> 1001 (1,000 writes)', '0 -> 1 each (4 tensors)'."""
    spans: dict[str, list[int]] = {}
    for bump in bumps:
        span = spans.setdefault(bump.label, [bump.old, bump.new])
        span[1] = bump.new
    if len(spans) == 1:
        text = f"{bumps[0].old} -> {bumps[-1].new}"
        return text + (f" ({len(bumps):,} writes)" if len(bumps) > 1 else "")
    uniform = len({tuple(s) for s in spans.values()}) == 1
    old, new = next(iter(spans.values())) if uniform else (None, None)
    text = f"{old} -> {new} each" if uniform else "various"
    writes = f", {len(bumps):,} writes" if len(bumps) > len(spans) else ""
    return f"{text} ({len(spans):,} tensors{writes})"


def _natural(label: str) -> tuple:
    """Sort key reading the numbers in a label as numbers: tensor#9 before tensor#10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", label))
