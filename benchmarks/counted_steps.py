"""Issue 34: the cost of counted steps (`recorder.counting.StepCounter`) on CPU training steps.

`python -m benchmarks.counted_steps [rounds] [steps]`: the MLP, CNN, LSTM, transformer and BERT
(Hugging Face, where `transformers` is installed) rows of `workloads`, one thread, each variant
running `steps` steps per timed sample, interleaved round by round and timed by this thread's CPU
time: untracked; the mechanism floor (an empty TorchFunctionMode plus no-op saved-tensor hooks,
`floor.mechanism`); no-op saved-tensor hooks alone; the counter (installed around the steps,
`end_step()` at each backward's end as watch mode calls it). Ratios are per-round medians.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

from autograd_magic.recorder.counting import StepCounter
from benchmarks import floor, workloads
from benchmarks.results import Row, skipped, verdict
from benchmarks.timing import interleave, ratios, time_once

WORKLOADS = {
    "MLP": workloads.mlp,
    "CNN": workloads.cnn,
    "LSTM": workloads.lstm,
    "transformer": workloads.transformer,
    "BERT": workloads.bert,
}


@contextmanager
def counted() -> Iterator[StepCounter]:
    """A counter as watch mode runs it: installed around the steps, a step per backward."""
    counter = StepCounter(sys._getframe(), None)
    counter.on_backward_end = counter.end_step
    with counter:
        yield counter


@contextmanager
def untracked() -> Iterator[None]:
    yield


def _around(block: Callable[[], AbstractContextManager[object]], step: Callable[[], None], n: int):
    def run() -> None:
        with block():
            for _ in range(n):
                step()

    return run


def _variants(step: Callable[[], None], steps: int) -> dict[str, Callable[[], None]]:
    """One workload's timed variants: untracked, the mechanism floor, no-op hooks alone and the
    counter, each running `steps` steps per sample."""
    blocks = {
        "untracked": untracked,
        "floor": floor.mechanism,
        "hooks_only": floor.no_op_hooks,
        "counter": counted,
    }
    return {name: _around(block, step, steps) for name, block in blocks.items()}


def _as_worst(found: dict[str, Any]) -> float:
    """The counter's ratio as the verdict reads it: the target is 1.05x, or no more than the
    mechanism where that alone is above it (so a ratio at a higher floor reads as 1.05x)."""
    return float(found["counter"].median - max(TARGET, found["floor"].median) + TARGET)


def _cpu_seconds(run: Callable[[], None]) -> float:
    # This thread's CPU time: on a shared machine, wall time also counts other jobs' turns.
    start = time.thread_time()
    run()
    return time.thread_time() - start


def measure(rounds: int = 15, steps: int = 5, warmup: int = 2) -> dict[str, dict[str, str]]:
    """Ratios to untracked, per workload and variant."""
    torch.set_num_threads(1)
    table: dict[str, dict[str, str]] = {}
    for name, build in WORKLOADS.items():
        workload = build()
        if workload is None:
            continue
        times = interleave(_variants(workload.step, steps), rounds, warmup, timer=_cpu_seconds)
        base = sorted(times["untracked"])[rounds // 2] * 1e3 / steps
        table[name] = {"untracked ms/step": f"{base:.2f}"}
        for variant, ratio in ratios(times, "untracked").items():
            table[name][variant] = ratio.describe()
        print(name, table[name], flush=True)
    return table


TARGET = 1.05


def row(quick: bool = False) -> Row:
    """Row 17: what a counted step costs on the CPU training steps, beside the mechanism floor
    (an empty function mode plus no-op hooks) and the no-op hooks alone, in the same rounds."""
    rounds, steps = (3, 1) if quick else (15, 5)
    torch.set_num_threads(1)
    worst = 0.0
    parts, floors = [], []
    skipped = []
    for name, build in WORKLOADS.items():
        workload = build(quick)
        if workload is None:
            skipped.append(f"{name}: not run (`transformers` is not installed)")
            continue
        variants = _variants(workload.step, steps)
        found = ratios(interleave(variants, rounds, 1, timer=_cpu_seconds), "untracked")
        counter, under = found["counter"], found["floor"]
        worst = max(worst, _as_worst(found))
        parts.append(f"{name} {counter.median:.2f}x")
        floors.append(
            f"{name}: counted {counter.describe()}; mechanism floor {under.describe()}; "
            f"no-op hooks alone {found['hooks_only'].describe()}"
        )
    return Row(
        key="17",
        workload="counted steps (watch mode), CPU training steps",
        ours=", ".join(parts),
        target=f"<= {TARGET:.2f}x, or the floor where it is higher",
        verdict=verdict(worst <= TARGET),
        details=[
            "Each variant runs the MLP, CNN, LSTM, transformer and BERT steps of rows 2-4, 9 "
            "and 11 "
            f"({steps} per sample, {rounds} interleaved rounds, this thread's CPU time); the "
            "counter is installed around the steps and ends a step at each backward call, as "
            "watch mode runs it.",
            *floors,
            *skipped,
        ],
    )


CUDA_WORKLOADS: dict[str, Callable[[bool], workloads.Workload | None]] = {
    "CNN": workloads.cuda_cnn,
    "BERT-base": lambda quick: workloads.hugging_face_cuda("13", quick),
    "GPT-2 small": lambda quick: workloads.hugging_face_cuda("14", quick),
    "small BERT": lambda quick: workloads.hugging_face_cuda("15", quick),
}


@contextmanager
def watched() -> Iterator[object]:
    """`autograd_magic.watch(first=0)`: every step counted, none captured (what a long run
    pays between captures), with the watch's own step bookkeeping on top of the counter."""
    from autograd_magic.watching import watch

    with watch(first=0) as w:
        yield w


def cuda_row(quick: bool = False) -> Row:
    """Row 17b: counted steps on the CUDA training steps of rows 5, 13-15, by wall time (each
    step ends with a synchronize), beside the mechanism floor in the same rounds."""
    title = "counted steps (watch mode), CUDA training steps"
    target = f"<= {TARGET:.2f}x, or the floor where it is higher"
    if not torch.cuda.is_available():
        return skipped("17b", title, "skipped: no GPU", target, "would run rows 5, 13-15 counted")
    rounds, steps = (3, 1) if quick else (11, 10)
    worst = 0.0
    parts, details = [], []
    for name, build in CUDA_WORKLOADS.items():
        workload = build(quick)
        if workload is None:
            details.append(f"{name}: not run (`transformers` is not installed)")
            continue
        variants = {
            **_variants(workload.step, steps),
            "watch": _around(watched, workload.step, steps),
        }
        times = interleave(variants, rounds, 2, timer=time_once)
        found = ratios(times, "untracked")
        base = sorted(times["untracked"])[rounds // 2] * 1e3 / steps
        counter, under = found["counter"], found["floor"]
        worst = max(worst, _as_worst(found))
        parts.append(f"{name} {counter.median:.2f}x")
        details.append(
            f"{name} ({base:.1f} ms/step untracked; {workload.details}): counted "
            f"{counter.describe()}; watch(first=0) {found['watch'].describe()}; mechanism floor "
            f"{under.describe()}; no-op hooks alone {found['hooks_only'].describe()}"
        )
        print(details[-1], flush=True)
    return Row(
        key="17b",
        workload=title,
        ours=", ".join(parts),
        target=target,
        verdict=verdict(worst <= TARGET),
        details=[
            f"Each variant runs {steps} steps per sample, {rounds} interleaved rounds, wall time "
            "(each step ends with torch.cuda.synchronize()).",
            *details,
        ],
    )


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    measure(*args)
