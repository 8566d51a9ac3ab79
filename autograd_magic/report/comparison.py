"""Comparison tables of several reports (the ranks of one job, a run before and after a fix):
peaks side by side and which finding appears in which trace."""

from __future__ import annotations

from collections.abc import Sequence

from autograd_magic.model.units import format_bytes
from autograd_magic.report.model import Report, Table

Named = Sequence[tuple[str, Report]]
MESSAGE_CHARS = 160


def peaks_table(named: Named) -> Table:
    """One row per trace: peak retained bytes and live nodes, what was left, findings, error."""
    rows = []
    for name, report in named:
        s = report.snapshot
        rows.append(
            (
                name,
                format_bytes(s.peak_retained_bytes),
                f"{s.peak_live_nodes:,}",
                format_bytes(s.retained_bytes),
                f"{s.live_nodes:,}",
                f"{len(report.findings):,}",
                report.error or "",
            )
        )
    headers = (
        "Trace",
        "Peak retained",
        "Peak live nodes",
        "Retained at end",
        "Live nodes at end",
        "Findings",
        "Error",
    )
    return Table("Traces side by side", headers, tuple(rows), "")


def findings_table(named: Named) -> Table:
    """Which finding (kind at a line) appears in which trace, with its bytes there."""
    keys: dict[tuple[str, int | None], str] = {}
    seen: dict[tuple[str, int | None], dict[int, int]] = {}
    for index, (_, report) in enumerate(named):
        for finding in report.findings:
            key = (finding.kind, finding.line)
            keys.setdefault(key, finding.message)
            per_trace = seen.setdefault(key, {})
            per_trace[index] = per_trace.get(index, 0) + finding.nbytes
    rows = []
    for (kind, line), message in keys.items():
        hits = seen[(kind, line)]
        short = message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 1] + "…"
        marks = [
            ("yes" + (f" ({format_bytes(hits[i])})" if hits[i] else "")) if i in hits else "-"
            for i in range(len(named))
        ]
        rows.append((kind, "" if line is None else str(line), *marks, short))
    headers = ("Finding", "Line", *(name for name, _ in named), "Message (first trace with it)")
    note = "" if rows else "No trace has findings."
    return Table("Findings per trace", headers, tuple(rows), note)
