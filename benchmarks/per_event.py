"""Workload 16: what one event costs, by kind, in microseconds: the levers' scale for issue 23.

Each kind is a loop of `n` torch calls that makes one kind of event per call, timed bare, under
the mechanism alone (an empty TorchFunctionMode and no-op saved-tensor hooks) and under
`track()` (compiled recorder, and pure Python in the same rounds), interleaved. A cost is
(variant - bare) / n, the median over rounds; "ours" is tracked minus the mechanism. No target:
the ratio rows judge; this row says where their time goes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

import autograd_magic
from benchmarks import floor
from benchmarks.overhead import pure_python
from benchmarks.results import Row
from benchmarks.timing import inside, interleave

Kind = tuple[str, Callable[[int], Callable[[], None]]]


def _chain(
    op: Callable[[torch.Tensor], torch.Tensor], requires_grad: bool = True, backward: bool = False
) -> Callable[[int], Callable[[], None]]:
    """A loop of `n` calls of `op`, each on the last one's result, from 16 floats (requiring
    grad or not); the chain's nodes die when the loop returns, or after a backward through it."""

    def build(n: int) -> Callable[[], None]:
        x = torch.randn(16, requires_grad=requires_grad)

        def run() -> None:
            y = x * 1.0 if requires_grad else x
            for _ in range(n):
                y = op(y)
            if backward:
                y.sum().backward()
                x.grad = None

        return run

    return build


def _write(n: int) -> Callable[[], None]:
    weight, step = torch.randn(16), torch.randn(16)

    def run() -> None:
        for _ in range(n):
            weight.add_(step, alpha=-1e-6)  # an optimizer's write

    return run


def _sin(y: torch.Tensor) -> torch.Tensor:
    return y.sin()  # SinBackward0 saves its input


def _scale(y: torch.Tensor) -> torch.Tensor:
    return y * 1.0001  # MulBackward0 with a scalar: a node, nothing saved


KINDS: tuple[Kind, ...] = (
    ("grad-off call (no node)", _chain(_sin, requires_grad=False)),
    ("op making a node (birth and death)", _chain(_scale)),
    ("op making a node and saving a tensor", _chain(_sin)),
    ("in-place write", _write),
    # per node: its saved tensor unpacked and released, the node freed
    ("op with a saved tensor, then backward through it", _chain(_sin, backward=True)),
)


def _variants(run: Callable[[], None]) -> dict[str, Callable[[], None]]:
    tracked = inside(autograd_magic.track, run)
    return {
        "bare": run,
        "mechanism": inside(floor.mechanism, run),
        "tracked": tracked,
        "tracked_pure": pure_python(tracked),
    }


def _costs(build: Callable[[int], Callable[[], None]], n: int, rounds: int) -> dict[str, float]:
    """Microseconds per call above the bare loop, per variant (median over rounds)."""
    times = interleave(_variants(build(n)), rounds, warmup=1)
    bare = times["bare"]
    return {
        name: statistics.median((t - b) / n * 1e6 for t, b in zip(values, bare, strict=True))
        for name, values in times.items()
        if name != "bare"
    }


def measure(quick: bool = False) -> Row:
    """Row 16: microseconds per event by kind (ours = tracked - mechanism)."""
    n, rounds = (50, 1) if quick else (2000, 15)
    details, summary = [], []
    for title, build in KINDS:
        cost = _costs(build, n, rounds)
        ours = cost["tracked"] - cost["mechanism"]
        summary.append(f"{title.split(' (')[0]} {ours:+.1f}")
        details.append(
            f"{title}: tracked {cost['tracked']:+.2f} us per call (pure Python "
            f"{cost['tracked_pure']:+.2f}), the mechanism alone {cost['mechanism']:+.2f}: "
            f"ours {ours:+.2f} us"
        )
    return Row(
        "16",
        "per-event cost (us, ours above the mechanism)",
        "; ".join(summary),
        details=[f"{n:,} calls per loop, {rounds} rounds; " + "; ".join(details)],
    )
