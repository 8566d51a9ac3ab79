"""Workload 6: a block of one million small ops under `track()`: time and the recorder's memory.

Each iteration runs four torch calls: `(x.sin() * 1.0001).sum()` on a requires-grad `x` (three
nodes, one saved tensor, all freed when `y` is dropped at the next iteration) and `w.add(1.0)`
on a plain tensor (no node); every 1,000th iteration calls `y.backward()`. The recorder's memory
is measured with tracemalloc around the tracked block: it counts every Python allocation, which
is where the recorder's records live (tensor storage goes through torch's own allocator and is
not counted), so the peak is the recorder's peak plus a few bytes of loop variables. That run is
separate from the timed runs because tracemalloc slows Python down.
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

import torch

import autograd_magic
from benchmarks.results import MEMORY_TARGET_BYTES, Row, verdict

OPS_PER_ITERATION = 4


def million_ops(ops: int) -> Callable[[], None]:
    """A block of `ops` small torch calls whose graphs die as they go."""
    x = torch.randn(16, requires_grad=True)
    w = torch.randn(16)

    def block() -> None:
        y = None
        for i in range(ops // OPS_PER_ITERATION):
            y = (x.sin() * 1.0001).sum()
            w.add(1.0)
            if i % 1000 == 999:
                y.backward()
        del y
        x.grad = None

    return block


SMALL_BLOCK_OPS = 1_000  # issue 23: per-event cost constant from 1,000 to 1,000,000 events
SMALL_BLOCK_ROUNDS = 21


@dataclass(frozen=True)
class Scale:
    untracked_s: float
    tracked_s: float
    peak_bytes: int
    kept_bytes: int
    nodes_created: int
    node_records: int
    small_block_us: float  # added per op in a block of SMALL_BLOCK_OPS (entry and exit included)


def _timed(block: Callable[[], None], tracked: bool) -> float:
    gc.collect()
    start = time.perf_counter()
    if tracked:
        with autograd_magic.track():
            block()
    else:
        block()
    return time.perf_counter() - start


def _memory(block: Callable[[], None]) -> tuple[int, int, int, int]:
    """(peak bytes during the block, bytes still held by the trace, nodes created, records)."""
    gc.collect()
    tracemalloc.start()
    try:
        with autograd_magic.track() as trace:
            block()
        gc.collect()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, kept, trace.nodes_created, len(trace.nodes)


def _small_block_us(rounds: int) -> float:
    """Microseconds added per op by tracking a block of SMALL_BLOCK_OPS of the same loop: the
    median over rounds of (tracked - untracked), the two alternated."""
    block = million_ops(SMALL_BLOCK_OPS)

    def added() -> float:
        return _timed(block, tracked=True) - _timed(block, tracked=False)

    added()  # warms the caches up
    return statistics.median(added() for _ in range(rounds)) / SMALL_BLOCK_OPS * 1e6


def measure(ops: int, small_rounds: int = SMALL_BLOCK_ROUNDS) -> list[Row]:
    """Untracked, tracked, untracked (the ratio uses the mean of both), then the memory run,
    then the same loop in small blocks (per-op cost against the block's length)."""
    block = million_ops(ops)
    before = _timed(block, tracked=False)
    tracked = _timed(block, tracked=True)
    after = _timed(block, tracked=False)
    peak, kept, created, records = _memory(block)
    small = _small_block_us(small_rounds)
    result = Scale((before + after) / 2, tracked, peak, kept, created, records, small)
    return [_row(ops, result), _constancy_row(ops, result)]


def _row(ops: int, s: Scale) -> Row:
    ratio = s.tracked_s / s.untracked_s
    ok = s.peak_bytes <= MEMORY_TARGET_BYTES
    return Row(
        key="6",
        workload=f"{ops:,} small ops",
        ours=(
            f"completes; {s.tracked_s:.1f} s tracked vs {s.untracked_s:.1f} s untracked "
            f"({ratio:.2f}x); recorder peak {s.peak_bytes / 1e6:.1f} MB"
        ),
        target="completes; recorder memory <= 100 MB",
        verdict=verdict(ok),
        details=[
            f"{ops // OPS_PER_ITERATION:,} iterations of `y = (x.sin() * 1.0001).sum()` "
            "(x: 16 floats, requires grad) and `w.add(1.0)` (no grad); `y.backward()` every "
            "1,000th iteration",
            f"{s.nodes_created:,} nodes created and freed; {s.node_records:,} node records kept; "
            f"{s.kept_bytes / 1e6:.1f} MB still held after the block (the Trace)",
            "memory: tracemalloc peak over the tracked block (Python allocations only: the "
            "recorder's records and bookkeeping; torch tensor storage is not counted), "
            "in a separate run from the timed ones",
        ],
        ratio=ratio,
    )


def _constancy_row(ops: int, s: Scale) -> Row:
    """Row 6b: the cost per op does not grow with the block (issue 23: constant from 1,000 to
    1,000,000 events); met when the long block's is within 10% of the short blocks'."""
    large_us = (s.tracked_s - s.untracked_s) / ops * 1e6
    return Row(
        key="6b",
        workload="per-op cost against the block's length",
        ours=(
            f"{s.small_block_us:.1f} us per op in blocks of {SMALL_BLOCK_OPS:,} ops; "
            f"{large_us:.1f} us in the block of {ops:,}"
        ),
        # One-sided: short blocks also pay a block's entry and exit, spread over fewer ops.
        target="no growth (<= 1.10x the short blocks')",
        verdict=verdict(large_us <= 1.10 * s.small_block_us),
        details=[
            f"row 6's loop; blocks of {SMALL_BLOCK_OPS:,} ops: the median over rounds of "
            "(tracked - untracked) of alternated blocks, entry and exit included; the block of "
            f"{ops:,}: row 6's timed runs"
        ],
    )
