"""The report of a watched block: what the counted steps show, which steps were captured and
why, each capture window's own report, and the out-of-memory post-mortem."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from autograd_magic.analysis.result import analyze
from autograd_magic.model.units import format_bytes
from autograd_magic.model.watch import (
    CaptureWindow,
    OutOfMemory,
    StepCounts,
    StepLog,
    WatchRecord,
)
from autograd_magic.report.build import ReportOptions, build_report
from autograd_magic.report.model import Report, Sentence, Table

STEP_ROWS = 12  # counted steps shown around each capture window and at the ends


@dataclass(frozen=True)
class WindowReport:
    """One capture window: its title ('Steps 5-7, captured: live backward roots grew from step
    2') and the full report of those steps."""

    title: str
    report: Report


@dataclass(frozen=True)
class WatchReport:
    """The report of a watched block: status line, summary sentences, the steps table, the
    out-of-memory post-mortem, and one report per capture window."""

    state: str  # "running", "finished" or "error"
    sentences: tuple[Sentence, ...]
    steps: Table
    out_of_memory: tuple[Sentence, ...]
    windows: tuple[WindowReport, ...]


def build_watch_report(record: WatchRecord, options: ReportOptions | None = None) -> WatchReport:
    """The report of `record`; each window's trace is analysed and reported once."""
    options = options or ReportOptions()
    state = "error" if record.error else ("finished" if record.finished else "running")
    windows = tuple(
        WindowReport(
            f"{w.steps_text[0].upper()}{w.steps_text[1:]}, captured: {w.reason}",
            build_report(analyze(w.trace), _window_options(record, w, options)),
        )
        for w in record.windows
    )
    oom = () if record.out_of_memory is None else out_of_memory_sentences(record.out_of_memory)
    found = [
        Sentence(f"{w.title.split(',')[0]}: {s.text}", s.line, s.kind)
        for w in windows
        for s in w.report.sentences
        if s.kind in ("finding", "error")
    ]
    sentences = (*found, *summary(record))
    return WatchReport(state, sentences, steps_table(record.steps), oom, windows)


def summary(record: WatchRecord) -> list[Sentence]:
    """How many steps, how many captured and why, what the counters did."""
    steps = record.steps
    if not steps:
        return [Sentence("No step ended (a step ends with each backward call).", None, "note")]
    captured = sum(_column(steps, "captured"))
    last = steps[-1]
    out = [
        Sentence(
            f"{last.step:,} steps: {captured:,} captured in full, {last.step - captured:,} "
            "counted (backward calls, live backward roots, saved tensors).",
            None,
            "note",
        )
    ]
    for window in record.windows:
        out.append(
            Sentence(f"{window.steps_text.capitalize()} captured: {window.reason}.", None, "note")
        )
    roots = _column(steps, "live_roots")
    retained = _column(steps, "retained_bytes")
    if max(roots) <= roots[0] + 1 and max(retained) == retained[0]:
        out.append(
            Sentence(
                f"The counters stayed flat from step to step: "
                f"{_count(roots[-1], 'live backward root')} and {format_bytes(retained[-1])} of "
                "saved tensors at the last step's end.",
                None,
                "note",
            )
        )
    else:
        out.append(
            Sentence(
                f"At the last step's end {_count(roots[-1], 'backward root')} were alive (most "
                f"{max(roots):,}) and graphs held {format_bytes(retained[-1])} of saved tensors "
                f"(most {format_bytes(max(retained))}).",
                None,
                "finding",
            )
        )
    return out


def steps_table(steps: Sequence[StepCounts]) -> Table:
    """The steps' counters: the first and last ones and those where a captured run begins or
    ends (with the step on each side)."""
    keep: set[int] = set(range(min(STEP_ROWS // 2, len(steps))))
    keep |= set(range(max(0, len(steps) - STEP_ROWS // 2), len(steps)))
    captured = _column(steps, "captured")
    for i in range(1, len(steps)):
        if captured[i] != captured[i - 1]:
            keep |= {i - 2, i - 1, i, i + 1}
    rows = []
    previous = -1
    for i in sorted(k for k in keep if 0 <= k < len(steps)):
        if previous >= 0 and i > previous + 1:
            rows.append(("...", "", "", "", "", "", ""))
        s = steps[i]
        rows.append(
            (
                f"{s.step:,}",
                "captured" if s.captured else "counted",
                f"{s.backward_calls:,}",
                f"{s.live_roots:,}",
                f"{s.live_saved:,}",
                format_bytes(s.retained_bytes),
                format_bytes(s.peak_bytes),
            )
        )
        previous = i
    headers = (
        "step",
        "recorded",
        "backward calls",
        "live backward roots",
        "saved tensors alive",
        "retained at end",
        "peak in step",
    )
    note = (
        "Counted at each step's end: backward roots still alive (a correct loop keeps at most "
        "the last loss's graph), saved tensors alive and their bytes, parameters and your leaf "
        "tensors left out. A captured step's bytes are its full record's, which also leaves out "
        "what your variables still hold (the loss, an output): they can read lower."
    )
    return Table("Steps", headers if rows else (), tuple(rows), note)


def out_of_memory_sentences(oom: OutOfMemory) -> tuple[Sentence, ...]:
    """What autograd held when memory ran out, largest first."""
    lines = ", ".join(f"line {line}: {format_bytes(n)}" for line, n in oom.by_line[:5])
    modules = ", ".join(
        f"{m or 'outside modules'}: {format_bytes(n)}" for m, n in oom.by_module[:5]
    )
    held = ", ".join(f"`{h}`" for h in oom.holders) or "no variable of the block"
    out = [
        Sentence(
            f"Out of memory at step {oom.step:,} ({oom.error.split(':', 1)[0]}). Autograd held "
            f"{format_bytes(oom.retained_bytes)} in {oom.saved_tensors:,} saved tensors, in "
            f"{_count(oom.live_roots, 'graph')} that reached a backward call and are still "
            "alive.",
            None,
            "error",
        )
    ]
    if lines:
        out.append(Sentence(f"Saved for backward, by line: {lines}.", None, "finding"))
    if modules:
        out.append(Sentence(f"By top-level module: {modules}.", None, "finding"))
    elif oom.modules_off:
        out.append(Sentence(f"By module: not recorded {oom.modules_off}.", None, "note"))
    out.append(Sentence(f"Holding tensors with graphs: {held}.", None, "finding"))
    if oom.last_steps:
        trend = ", ".join(format_bytes(s.retained_bytes) for s in oom.last_steps)
        out.append(Sentence(f"Retained at the last steps' ends: {trend}.", None, "note"))
    return tuple(out)


def _count(n: int, noun: str) -> str:
    """'1 graph', '3 graphs'."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def _column(steps: Sequence[StepCounts], name: str) -> list[int]:
    """One counter of every step (read in place from a `StepLog`)."""
    if isinstance(steps, StepLog):
        return steps.column(name)
    return [int(getattr(s, name)) for s in steps]


def _window_options(
    record: WatchRecord, window: CaptureWindow, options: ReportOptions
) -> ReportOptions:
    """A window's report options: one that ended before the block says so ("When the capture
    of steps 1-20 ended, ..."); the last one, recording to the block's end, is the block's."""
    last_step = record.steps[-1].step if len(record.steps) else 0
    if record.windows[-1] is window and window.last_step in (last_step, window.first_step - 1):
        return options
    return dataclasses.replace(options, block=f"capture of {window.steps_text}")


def progress_text(record: WatchRecord) -> str:
    """What a running watch has done so far, for a live panel between captures: 'step 812
    counted (steps 1-20 captured in full); 1 live backward root and 0 B of saved tensors at its
    end'."""
    if not len(record.steps):
        return "no step ended yet"
    last = record.steps[-1]
    captured = "; ".join(w.steps_text for w in record.windows)
    done = f" ({captured} captured in full)" if captured else ""
    how = "captured" if last.captured else "counted"
    return (
        f"step {last.step:,} {how}{done}; {_count(last.live_roots, 'live backward root')} and "
        f"{format_bytes(last.retained_bytes)} of saved tensors at its end"
    )
