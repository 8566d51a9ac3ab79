"""Row 19 (issue 34): a 1,000-step training loop in one `%%trackgraph` cell with the default
options (the first `CELL_FULL_STEPS` steps recorded in full, the rest counted, escalation on),
against the same cell run plain, in one IPython shell (`InteractiveShell`, as a terminal IPython
runs cells: the finished trace's report is printed, and its cost is part of the cell's).

The loop is row 10's (a small MLP, batch 16, SGD) written out in the cell as a user writes it.
`--full` (every step recorded, row 10b's block as a cell) is timed in the same rounds for
comparison. Each variant is one `run_cell` per round, interleaved, this thread's CPU time.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import torch

from autograd_magic.magic import CELL_FULL_STEPS, last_trace
from benchmarks.results import Row, verdict
from benchmarks.timing import interleave, ratios

TARGET = 1.3
SETUP = """\
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear({width}, {width}), nn.ReLU(), nn.Linear({width}, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
inputs, target = torch.randn(16, {width}), torch.randn(16, 1)
"""
LOOP = """\
for step in range({steps}):
    optimizer.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(inputs), target)
    loss.backward()
    optimizer.step()
"""


def shell() -> Any:
    """The IPython shell the cells run in, with the extension loaded and no colours."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("colors", "nocolor")
    ip.extension_manager.load_extension("autograd_magic")
    return ip


def run_cell(ip: Any, cell: str) -> Callable[[], None]:
    """A variant: `cell` run in `ip`, its output captured (and dropped); its error raised."""
    from IPython.utils.capture import capture_output

    def run() -> None:
        with capture_output():
            result = ip.run_cell(cell)
        result.raise_error()

    return run


def _page_seconds(trace: Any) -> float:
    """Seconds to render a watched cell's report as a Jupyter kernel shows it (HTML)."""
    from autograd_magic.views.html import watch_page

    start = time.perf_counter()
    watch_page(trace.report(block="cell"))
    return time.perf_counter() - start


def _timed(run: Callable[[], None]) -> float:
    # This thread's CPU time (as row 17): on a shared 2-core machine, wall time also counts
    # other jobs' turns, which moved this ratio by +-0.1 from one run to the next.
    gc.collect()
    start = time.thread_time()
    run()
    return time.thread_time() - start


def measure(steps: int = 1000, rounds: int = 5, quick: bool = False) -> Row:
    """Row 19: the default `%%trackgraph` cell / the plain cell, and `--full` / plain."""
    ip = shell()
    run_cell(ip, SETUP.format(width=8 if quick else 64))()
    loop = LOOP.format(steps=steps)
    variants = {
        "plain": run_cell(ip, loop),
        "default": run_cell(ip, "%%trackgraph\n" + loop),
        "full": run_cell(ip, "%%trackgraph --full\n" + loop),
    }
    times = interleave(variants, rounds, 1 if not quick else 0, timer=_timed)
    ratio = ratios(times, "plain")
    variants["default"]()
    page_s = _page_seconds(last_trace())
    plain = sorted(times["plain"])[len(times["plain"]) // 2]
    ours = ratio["default"]
    torch_threads = torch.get_num_threads()
    return Row(
        key="19",
        workload=f"{steps:,}-step loop in one %%trackgraph cell (default)",
        ours=ours.describe(),
        target=f"<= {TARGET:.2f}x",
        verdict=verdict(ours.median <= TARGET),
        details=[
            f"row 10's loop written out in a cell ({steps:,} steps of a small MLP, SGD), run "
            f"by an IPython InteractiveShell: plain, %%trackgraph (the first "
            f"{CELL_FULL_STEPS} steps in full, the rest counted) and %%trackgraph --full (every "
            f"step in full), interleaved, CPU time of run_cell including the printed report; "
            f"{torch_threads} torch thread(s)",
            f"plain cell {plain:.2f} s; --full / plain in the same rounds: "
            f"{ratio['full'].describe()}",
            f"in a Jupyter kernel the default cell's end also renders the watch report's HTML "
            f"(steps and each window's report, with pictures; a terminal shows the text only): "
            f"{page_s:.2f} s more, {page_s / plain:.0%} of the plain cell",
        ],
        ratio=ours.median,
    )
