"""Workloads 1-5: tracked and torch.profiler runs against untracked runs, interleaved."""

from __future__ import annotations

from collections.abc import Callable

import torch

import autograd_magic
from autograd_magic.recorder import native
from benchmarks import floor
from benchmarks.results import ONE_BLOCK_TARGET, RATIO_TARGETS, Floor, Row, verdict
from benchmarks.timing import Block, inside, interleave, ratios
from benchmarks.workloads import Workload


def _profiler(device: str) -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities, profile_memory=True, record_shapes=True, with_stack=True
    )


def variants(workload: Workload, steps: int) -> dict[str, Callable[[], None]]:
    """The ways to run `steps` steps: bare; each under its own `track()` block and each under its
    own torch.profiler (one step per block, as a cell holding one step would be: the verdict);
    all in one `track()` block, as a cell holding a training loop would be; and the floors under
    both (benchmarks/floor.py), with the mechanism's two halves apart."""
    step = workload.step

    def untracked() -> None:
        for _ in range(steps):
            step()

    def each_in(block: Block) -> Callable[[], None]:
        one = inside(block, step)

        def run() -> None:
            for _ in range(steps):
                one()

        return run

    def all_in(block: Block) -> Callable[[], None]:
        return inside(block, untracked)

    tracked = each_in(autograd_magic.track)
    return {
        "untracked": untracked,
        "tracked": tracked,
        "profiler": each_in(lambda: _profiler(workload.device)),
        "tracked_pure": pure_python(tracked),
        "tracked_loop": all_in(autograd_magic.track),
        "mechanism": each_in(floor.mechanism),
        "mechanism_loop": all_in(floor.mechanism),
        "reads_only": each_in(floor.reads_only),
        "reads_only_loop": all_in(floor.reads_only),
        "mode_only": each_in(floor.EmptyMode),
        "hooks_only": each_in(floor.no_op_hooks),
    }


def pure_python(run: Callable[[], None]) -> Callable[[], None]:
    """`run` with the pure-Python recorder (as AUTOGRAD_MAGIC_PURE_PYTHON=1 gives): the A/B of
    the compiled one, in the same rounds."""

    def run_pure() -> None:
        compiled, native.NATIVE = native.NATIVE, None
        try:
            run()
        finally:
            native.NATIVE = compiled

    return run_pure


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def events_per_step(run: Callable[[], None], steps: int = 1) -> int:
    """Events a step records (each takes a sequence number in the trace), on average over the
    `steps` steps `run` makes in one tracked block."""
    with autograd_magic.track() as trace:
        run()
    return max(1, round(trace.seq / steps))


def measure(workload: Workload, rounds: int, warmup: int, steps: int = 1) -> Row:
    """Interleave the variants; the row shows each ratio's median and spread."""
    times = interleave(variants(workload, steps), rounds, warmup)
    found = ratios(times, "untracked")
    ours, peer, loop = found["tracked"], found["profiler"], found["tracked_loop"]
    mechanism = found["mechanism"]
    base_ms = sorted(times["untracked"])[len(times["untracked"]) // 2] * 1e3 / steps
    limit = RATIO_TARGETS[workload.key]
    events = events_per_step(workload.step)
    extra_us = {
        name: (_median(times[name]) - _median(times["untracked"])) * 1e6 / steps / events
        for name in ("tracked", "tracked_pure", "tracked_loop")
    }
    return Row(
        key=workload.key,
        workload=workload.title,
        ours=ours.describe(),
        peer=peer.describe(),
        target=f"<= {limit:.2f}x",
        verdict=verdict(ours.median <= limit),
        details=[
            f"{workload.details}; untracked median {base_ms:.2f} ms per step; "
            f"{steps} step(s) per timed sample, each in its own tracked/profiled block",
            f"tracked min-max {ours.low:.2f}-{ours.high:.2f}x; "
            f"torch.profiler min-max {peer.low:.2f}-{peer.high:.2f}x",
            f"the same {steps} step(s) in one tracked block (a cell holding the loop): "
            f"{loop.describe()}",
            f"the mechanism alone (an empty TorchFunctionMode and no-op saved-tensor hooks per "
            f"block, no bookkeeping): {mechanism.describe()}, around all {steps} step(s) in one "
            f"block {found['mechanism_loop'].describe()}; the empty mode alone "
            f"{found['mode_only'].describe()}; the no-op hooks alone "
            f"{found['hooks_only'].describe()}; the reads alone (the mechanism tagging each new "
            f"node and reading each saved tensor, no records: benchmarks/floor.py): "
            f"{found['reads_only'].describe()}, in one block {found['reads_only_loop'].describe()}",
            f"recorder {native.STATUS}; the pure-Python recorder in the same rounds: "
            f"{found['tracked_pure'].describe()}; {events:,} recorded events per step, host time "
            f"added per event {extra_us['tracked']:.2f} us compiled, "
            f"{extra_us['tracked_pure']:.2f} us pure Python",
        ],
        ratio=ours.median,
        peer_ratio=peer.median,
        in_one_block=loop.describe(),
        in_one_block_ratio=loop.median,
        floor=Floor(
            limit,
            mechanism.median,
            base_ms,
            events,
            extra_us["tracked"],
            found["reads_only"].median,
        ),
        one_block_floor=Floor(
            ONE_BLOCK_TARGET,
            found["mechanism_loop"].median,
            base_ms,
            events,
            extra_us["tracked_loop"],
            found["reads_only_loop"].median,
        ),
    )
