"""Corrections to a recorded timeline of retained bytes, made when a read learns who holds what."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from autograd_magic.model.records import TimelineSample


def correct_retained(
    timeline: list[TimelineSample], deltas: Sequence[tuple[int, int]], since_seq: int
) -> int:
    """Add each (first sequence, bytes) delta to the retained bytes of every sample from that
    sequence on; return the largest retained bytes among samples after `since_seq` (0 if none)."""
    starts = sorted(deltas)
    if starts:
        # A read per backward call: find the first sample to correct without a pass over all.
        at = bisect.bisect_left(timeline, starts[0][0], key=_seq)
        applied, total = 0, 0
        for i in range(at, len(timeline)):
            sample = timeline[i]
            while applied < len(starts) and starts[applied][0] <= sample.seq:
                total += starts[applied][1]
                applied += 1
            if total:
                timeline[i] = sample._replace(retained_bytes=sample.retained_bytes + total)
    best = 0
    for sample in reversed(timeline):
        if sample.seq <= since_seq:
            break
        best = max(best, sample.retained_bytes)
    return best


def delta_at(deltas: Sequence[tuple[int, int]], seq: int) -> int:
    """The total of the deltas that apply at `seq` (those first saved at or before it)."""
    return sum(delta for first, delta in deltas if first <= seq)


def _seq(sample: TimelineSample) -> int:
    return sample.seq
