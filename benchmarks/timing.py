"""Interleaved timing: variants of one workload run A B C, B C A, ... in one process.

Every figure is a ratio of two variants timed in the same round, so machine noise that lasts
longer than one round (other jobs on a shared CPU) cancels. The median and the spread of the
per-round ratios are reported.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar, overload

T = TypeVar("T")

# What a variant runs its workload inside: `track`, the profiler, a floor (a fresh one per call).
Block = Callable[[], AbstractContextManager[object]]


def inside(block: Block, run: Callable[[], None]) -> Callable[[], None]:
    """`run` inside a fresh `block()`: one variant of a timed workload."""

    def variant() -> None:
        with block():
            run()

    return variant


@dataclass(frozen=True)
class Ratio:
    """Per-round ratios of a variant's time to the baseline's: median, quartiles, extremes."""

    median: float
    q1: float
    q3: float
    low: float
    high: float
    rounds: int

    def describe(self) -> str:
        """'1.23x (IQR 1.20-1.26, n=21)'; one round has no spread to show."""
        if self.rounds < 2:
            return f"{self.median:.2f}x (n=1)"
        return f"{self.median:.2f}x (IQR {self.q1:.2f}-{self.q3:.2f}, n={self.rounds})"


def ratio_of(values: list[float]) -> Ratio:
    """Summarize a list of per-round ratios."""
    ordered = sorted(values)
    if len(ordered) < 2:
        q1 = q3 = ordered[0]
    else:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return Ratio(statistics.median(ordered), q1, q3, ordered[0], ordered[-1], len(ordered))


def time_once(run: Callable[[], object]) -> float:
    """Seconds taken by one call; garbage from earlier calls is collected first, untimed."""
    gc.collect()
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


@overload
def interleave(
    variants: Mapping[str, Callable[[], object]], rounds: int, warmup: int
) -> dict[str, list[float]]: ...


@overload
def interleave(
    variants: Mapping[str, Callable[[], object]],
    rounds: int,
    warmup: int,
    timer: Callable[[Callable[[], object]], T],
) -> dict[str, list[T]]: ...


def interleave(
    variants: Mapping[str, Callable[[], object]],
    rounds: int,
    warmup: int,
    timer: Callable[[Callable[[], object]], Any] = time_once,
) -> dict[str, list[Any]]:
    """`timer(variant)` (seconds per call by default) of each variant, one call of each per
    round, order rotating per round."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    times: dict[str, list[Any]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(timer(variants[name]))
    return times


def ratios(times: Mapping[str, list[float]], baseline: str) -> dict[str, Ratio]:
    """Each non-baseline variant's per-round ratio to the baseline."""
    base = times[baseline]
    return {
        name: ratio_of([t / b for t, b in zip(values, base, strict=True)])
        for name, values in times.items()
        if name != baseline
    }
