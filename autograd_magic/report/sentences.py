"""The report's sentences: the headline numbers, the error, the findings (worded by
`report.wording`), the live provisional finding, blind spots, caps and backward calls."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from autograd_magic.analysis.layout import Box
from autograd_magic.analysis.result import Analysis
from autograd_magic.model.records import BackwardCall, Finding, Holder
from autograd_magic.model.units import format_bytes, where
from autograd_magic.report.model import Sentence
from autograd_magic.report.modules import top_modules_text
from autograd_magic.report.wording import finding, growth_finding


def summary_items(analysis: Analysis) -> list[tuple[str, str]]:
    """The headline numbers as (label, value) pairs."""
    trace, s = analysis.trace, analysis.snapshot
    return [
        ("Live autograd nodes", f"{s.live_nodes:,} now / {s.peak_live_nodes:,} peak"),
        (
            "Retained saved tensors",
            f"{format_bytes(s.retained_bytes)} now / {format_bytes(s.peak_retained_bytes)} peak",
        ),
        ("Nodes created", f"{s.nodes_created:,}"),
        ("Tensors saved for backward", f"{s.buffers_saved:,}"),
        ("Backward calls", f"{len(trace.backward_calls):,}"),
        ("Shared-storage groups", f"{len(analysis.storage_groups)}"),
        ("Version bumps (in-place writes)", f"{len(trace.version_bumps):,}"),
        *([("Most saved memory", top)] if (top := top_modules_text(analysis)) else []),
    ]


def worded_findings(analysis: Analysis) -> list[Finding]:
    """The findings as `Finding` records: the facts worded, or the sentences an old file
    stored."""
    if analysis.stored_findings is not None:
        return list(analysis.stored_findings)
    return [finding(fact) for fact in analysis.facts]


def sentences(analysis: Analysis, block: str) -> list[Sentence]:
    """The error, the findings, blind spots and caps, as sentences with their lines; then what
    was still alive at the end, when anything was. `block` names the traced code ("cell")."""
    trace, s = analysis.trace, analysis.snapshot
    out: list[Sentence] = []
    if trace.error:
        site = trace.error_site
        at = where(site)
        prefix = f"{at[0].upper()}{at[1:]} raised" if at else f"The {block} raised"
        out.append(
            Sentence(
                f"{prefix} {trace.error.rstrip('.')}. Everything recorded up to then is shown.",
                None if site is None else (site.outer_line or site.line),
                "error",
            )
        )
    for found in worded_findings(analysis):
        out.append(Sentence(_with_lines(found.message, found), found.line, "finding"))
    if analysis.growth is not None:
        out.append(growth_finding(analysis.growth, block))
    for spot in trace.blindspots:
        out.append(Sentence(spot.message, spot.line, "blindspot"))
    if trace.dropped_nodes or trace.dropped_buffers or trace.dropped_events:
        out.append(
            Sentence(
                f"Record cap of {trace.max_records:,} reached: {trace.dropped_nodes:,} nodes, "
                f"{trace.dropped_buffers:,} saved tensors and {trace.dropped_events:,} in-place "
                "writes or memory links are counted but not listed.",
                None,
                "blindspot",
            )
        )
    if trace.finished and not out:
        out.append(Sentence("No findings.", None, "note"))
    if trace.finished and s.live_nodes:
        out.append(
            Sentence(
                f"When the {block} ended, {s.live_nodes:,} autograd nodes were still "
                "alive, holding "
                f"{format_bytes(s.retained_bytes)} of saved tensors "
                f"(peak {format_bytes(s.peak_retained_bytes)}){_kept_by(trace.holders)}.",
                None,
                "note",
            )
        )
    return out


def _kept_by(holders: Iterable[Holder]) -> str:
    """', kept by `logits` and `loss`': the variables holding the graphs still alive at the end
    (a clean cell's "No findings." otherwise leaves the reader asking why they are alive)."""
    names = list(dict.fromkeys(re.split(r"[\[.]", h.path, maxsplit=1)[0] for h in holders))
    if not names:
        return ""
    shown = [f"`{name}`" for name in names[:4]]
    if len(names) > 4:  # 'and 2 more' would name two fewer than it takes to say
        shown[-1] = f"{len(names) - 3:,} more"
    return ", kept by " + (
        shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"
    )


def _with_lines(text: str, finding: Finding) -> str:
    """`text` with its line in front and its related lines after, leaving out every line the
    sentence already names: "Line 7: ... at line 7" would say it twice."""
    named = named_lines(text)
    if finding.line is not None and finding.line not in named:
        text = f"Line {finding.line}: {text}"
    related = set(finding.related_lines) - named - {finding.line}
    if related:
        text += f" (see also {_lines(related)})"
    return text


# "line 7", "lines 3, 4 and 5", "lines 3-5": the numbers a sentence names as lines.
_LINE_MENTION = re.compile(r"\b[Ll]ines? (\d+(?:(?:, | and | or |-|, \.\.\. )\d+)*)")


def named_lines(text: str) -> set[int]:
    """The line numbers `text` names ("line 7", "lines 3, 4 and 5")."""
    return {int(n) for m in _LINE_MENTION.finditer(text) for n in re.findall(r"\d+", m[1])}


def backward_sentences(analysis: Analysis) -> list[Sentence]:
    """One sentence per line and kind of backward()/grad call (flags, what each released, its
    error), in order of first call: a loop's 1,000 calls read as one sentence."""
    trace = analysis.trace
    groups: dict[tuple, list[BackwardCall]] = {}
    for call in trace.backward_calls:
        key = (
            call.site.describe(),
            call.kind,
            call.retain_graph,
            call.create_graph,
            call.error_type,
            call.error,
        )
        groups.setdefault(key, []).append(call)
    return [_backward_sentence(calls, trace.error) for calls in groups.values()]


def _backward_sentence(calls: list[BackwardCall], stopped_by: str | None = None) -> Sentence:
    """The sentence of one group of calls; a call that failed with the error that stopped the
    block points at it, whose sentence gives PyTorch's text (said once)."""
    call = calls[0]
    flags = (("retain_graph", call.retain_graph), ("create_graph", call.create_graph))
    shown = ", ".join(f"{name}=True" for name, on in flags if on)
    at = call.site.describe()
    line = call.site.outer_line or call.line
    what = f"{call.kind}({shown})"
    head = f"{at[0].upper()}{at[1:]}: " + (
        what if len(calls) == 1 else f"{len(calls):,} {what} calls"
    )
    if call.error_type:
        every = "" if len(calls) == 1 else " each"
        if stopped_by == f"{call.error_type}: {call.error}":
            text = f"{head} failed{every} with the {call.error_type} above."
            return Sentence(text, line, "error")
        return Sentence(f"{head} failed{every} with {call.error_type}: {call.error}", line, "error")
    counts = sorted({c.released_buffers for c in calls})
    sizes = sorted({c.released_bytes for c in calls})
    each = "" if len(calls) == 1 else ", each"
    if counts == [0] and sizes == [0]:
        text = f"{head}{each} released no saved tensors"
    elif sizes == [0]:  # what they saved is held by parameters, variables, other tensors
        released = _tensors(call.released_buffers) if len(calls) == 1 else _span(counts, str)
        text = (
            f"{head}{each} released {released}{'' if len(calls) == 1 else ' saved tensors'}, "
            "freeing no memory: something besides the graph still holds theirs"
        )
    elif len(calls) == 1:
        text = (
            f"{head} released {_tensors(call.released_buffers)}, freeing "
            f"{format_bytes(call.released_bytes)} of retained memory"
        )
    elif len(counts) == 1 and len(sizes) == 1:
        text = (
            f"{head}, each released {_tensors(counts[0])}, freeing "
            f"{format_bytes(sizes[0])} of retained memory"
        )
    else:
        total = sum(c.released_bytes for c in calls)
        text = (
            f"{head}, each released {_span(counts, str)} saved tensors, freeing "
            f"{_span(sizes, format_bytes)} ({format_bytes(total)} in all)"
        )
    if call.retain_graph:
        text += "; the graph was kept for another backward"
    return Sentence(text + ".", line, "note")


def _tensors(count: int) -> str:
    return "1 saved tensor" if count == 1 else f"{count:,} saved tensors"


def _span(values: list[int], show: Callable[[int], str]) -> str:
    return show(values[0]) if len(values) == 1 else f"{show(values[0])} to {show(values[-1])}"


def _lines(lines: Iterable[int]) -> str:
    items = sorted(set(lines))
    return ("line " if len(items) == 1 else "lines ") + ", ".join(str(n) for n in items)


MIN_STEPS = 3  # backward calls before the timeline counts steps (a loop, not a retry)


def live_timeline_note(analysis: Analysis) -> str:
    """What the live sparkline shows, with its scales: it has no axes of its own."""
    s = analysis.snapshot
    done = sum(1 for c in analysis.trace.backward_calls if c.end_seq is not None)
    over = "one step per backward call" if done >= MIN_STEPS else "recorded events in order"
    # The picture is redrawn less often than the numbers above it: say when it was drawn.
    when = f"drawn after {done:,} backward call{'s' if done != 1 else ''}"
    return (
        f"Live, {when}: autograd nodes alive (blue, top: 0 to {s.peak_live_nodes:,} peak) and "
        "retained "
        f"saved tensors (orange, bottom: 0 B to {format_bytes(s.peak_retained_bytes)} peak), "
        f"{over}; where a pixel column covers several values, a darker band spans them. The "
        "timeline with axes and line labels replaces it when the cell ends."
    )


def join_items(items: list[str]) -> str:
    """The first 20 items, then how many more."""
    return ", ".join(items[:20]) + (f" and {len(items) - 20} more" if len(items) > 20 else "")


def node_lines(analysis: Analysis, box: Box) -> tuple[str, ...]:
    """A graph box's label, where its nodes were made, how many live and where the others were
    freed."""
    by_id = analysis.nodes_by_id
    records = [r for r in (by_id.get(m) for m in box.members) if r is not None]
    born = sorted({r.born_site.describe() for r in records})
    freed = sorted({r.freed_site.describe() for r in records if r.freed_site is not None})
    return (
        box.label,
        f"created at {join_items(born)}",
        f"{box.alive:,} of {len(box.members):,} still alive"
        + (f"; freed at {join_items(freed)}" if freed else ""),
    )
