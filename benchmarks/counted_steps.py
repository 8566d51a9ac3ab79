"""Issue 34: the cost of counted steps (`recorder.counting.StepCounter`) on CPU training steps.

`python -m benchmarks.counted_steps [rounds] [steps]`: the MLP, CNN, LSTM and transformer rows
of `workloads`, one thread, each variant running `steps` steps per timed sample, interleaved
round by round and timed by this thread's CPU time: untracked; the mechanism floor (an empty
TorchFunctionMode plus no-op saved-tensor hooks, `floor.mechanism`); no-op saved-tensor hooks
alone; the counter (installed around the steps, `end_step()` at each backward's end as watch
mode calls it). Ratios are per-round medians.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import torch

from autograd_magic.recorder.counting import StepCounter
from benchmarks import floor, workloads
from benchmarks.timing import interleave, ratios

WORKLOADS = {
    "MLP": workloads.mlp,
    "CNN": workloads.cnn,
    "LSTM": workloads.lstm,
    "transformer": workloads.transformer,
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
        variants = {
            "untracked": _around(untracked, workload.step, steps),
            "floor": _around(floor.mechanism, workload.step, steps),
            "hooks_only": _around(floor.no_op_hooks, workload.step, steps),
            "counter": _around(counted, workload.step, steps),
        }
        times = interleave(variants, rounds, warmup, timer=_cpu_seconds)
        base = sorted(times["untracked"])[rounds // 2] * 1e3 / steps
        table[name] = {"untracked ms/step": f"{base:.2f}"}
        for variant, ratio in ratios(times, "untracked").items():
            table[name][variant] = ratio.describe()
        print(name, table[name], flush=True)
    return table


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    measure(*args)
