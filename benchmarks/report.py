"""Rendering results: the machine description, the console table and `BENCHMARKS.md`."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.results import MET, MISSED, PENDING, SKIPPED, Row
from benchmarks.workloads import gpu_name

COLUMNS = ("#", "workload", "autograd_magic (tracked / untracked)", "peer", "target", "verdict")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def revision() -> str:
    """The checkout's commit, marked when autograd_magic/ has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=False, timeout=10
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "autograd_magic")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit or "unknown") + (" + uncommitted changes in autograd_magic/" if dirty else "")


def machine() -> list[str]:
    """Lines describing where and when the suite ran."""
    gpu = gpu_name()
    return [
        f"CPU: {cpu_model()}, {os.cpu_count()} cores visible, "
        f"torch threads {torch.get_num_threads()}",
        f"GPU: {gpu or 'none'}",
        f"torch {torch.__version__}, Python {platform.python_version()} "
        f"({platform.python_implementation()}), {platform.system()} {platform.release()}",
        f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
        f"autograd_magic at {revision()}",
        f"command: {' '.join(['python -m benchmarks', *sys.argv[1:]])}",
    ]


def _cells(row: Row) -> tuple[str, ...]:
    return (row.key, row.workload, row.ours, row.peer, row.target, row.verdict)


def table_text(rows: list[Row]) -> str:
    """The results as a plain-text table."""
    return text_table(COLUMNS, [_cells(r) for r in rows])


def text_table(header: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    cells = [header, *body]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)) for cell in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def table_markdown(header: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in body]
    return "\n".join(lines)


def _all_met(rows: list[Row]) -> str:
    verdicts = {r.verdict for r in rows}
    if not verdicts or verdicts <= {SKIPPED, PENDING}:
        return " / ".join(sorted(verdicts)) or SKIPPED
    return MISSED if MISSED in verdicts else MET


def targets(rows: list[Row]) -> list[tuple[str, str, str]]:
    """The issue's targets table with a verdict per line."""
    by_key = {r.key: r for r in rows}

    def pick(*keys: str) -> list[Row]:
        return [by_key[k] for k in keys if k in by_key]

    overhead = [r for r in rows if r.ratio is not None and r.peer_ratio is not None]
    below = [r.workload for r in overhead if r.ratio >= r.peer_ratio]
    below_verdict = MET if overhead and not below else MISSED if below else SKIPPED
    return [
        ("1 tiny-op loop", "<= 2.0x (issue 14)", _all_met(pick("1"))),
        (
            "2 MLP, 3 CNN, 4 LSTM, 9 transformer, 10 1,000-step loop, 11 BERT on CPU",
            "<= 1.10x (issue 14)",
            _all_met(pick("2", "3", "4", "9", "10", "11")),
        ),
        ("10b 1,000 small steps in one block", "<= 2.0x (issue 23)", _all_met(pick("10b"))),
        ("5 CNN on CUDA", "<= 1.10x", _all_met(pick("5"))),
        (
            "13 BERT-base, 14 GPT-2 small, 15 small BERT on CUDA",
            "<= 1.15x (issue 23)",
            _all_met(pick("13", "14", "15")),
        ),
        ("12 1,000-step LSTM script, collector on", "<= 1.5x (issue 23)", _all_met(pick("12"))),
        ("11b block exit after a BERT step", "<= 5 ms (issue 23)", _all_met(pick("11b"))),
        (
            "every workload",
            "below torch.profiler's overhead with memory, shapes and stacks",
            below_verdict + (f" ({', '.join(below)})" if below else ""),
        ),
        (
            "6 one million ops",
            "completes; recorder memory <= 100 MB (issue 23)",
            _all_met(pick("6")),
        ),
        (
            "6b per-op cost, blocks of 1,000 ops against one of 1,000,000",
            "does not grow with the block's length (issue 23: constant)",
            _all_met(pick("6b")),
        ),
        ("7 live panel", "<= 5% extra on workload 2", _all_met(pick("7a"))),
        ("7 graph view", "10,000-node graph view <= 2 s", _all_met(pick("7b"))),
        ("7 panel at cell end", "<= 5% of workload 10's loop (issue 12)", _all_met(pick("7c"))),
        (
            "7 full trace report",
            "100,000-node trace rendered <= 2 s (issue 12)",
            _all_met(pick("7d")),
        ),
        ("8 accuracy", "within 1% of the allocator (exact is possible)", _all_met(pick("8"))),
    ]


FLOOR_COLUMNS = (
    "#",
    "target",
    "mechanism alone",
    "reads alone",
    "untracked step",
    "events per step",
    "left per event",
    "ours per event now",
)


def floors(rows: list[Row]) -> list[tuple[str, ...]]:
    """Per ratio target: what the mechanism alone, measured in the same rounds, leaves of it
    for the recorder's own work per event; 'none' where no recorder on that mechanism meets it."""
    body = []
    for row in rows:
        floor = row.floor
        if floor is None:
            continue
        left = f"{floor.budget_us:.2f} us" if floor.reachable else "none: unreachable"
        body.append(
            (
                row.key,
                f"<= {floor.target:.2f}x",
                f"{floor.mechanism:.2f}x",
                "-" if floor.reads_only is None else f"{floor.reads_only:.2f}x",
                f"{floor.step_ms:.2f} ms",
                f"{floor.events:,}",
                left,
                f"{floor.ours_us:.2f} us",
            )
        )
    return body


def markdown(
    rows: list[Row], quick: bool, elapsed_s: float, where: list[str], notes: str = ""
) -> str:
    """The whole of BENCHMARKS.md; `where` is `machine()` taken when the run started."""
    floor_rows = floors(rows)
    parts = [
        "# Benchmarks",
        "",
        "Written by `python -m benchmarks` (do not edit by hand; re-run it). Every ratio is "
        "measured in one process, the variants interleaved round by round after warm-up "
        "(order rotating: A B C, B C A, C A B), and is the median of the per-round ratios; IQR "
        "is the spread of those ratios. `peer` is torch.profiler with profile_memory, "
        "record_shapes and with_stack on the same step, unless the row says otherwise.",
        "",
        "## Machine",
        "",
        *(f"- {line}" for line in where),
        f"- mode: {'quick (toy sizes, one round: proves the suite runs)' if quick else 'full'}; "
        f"suite took {elapsed_s:.0f} s",
        "",
        "## Results",
        "",
        table_markdown(COLUMNS, [_cells(r) for r in rows]),
        "",
        "## Targets (issues 6, 12, 14, 23)",
        "",
        table_markdown(("workload", "target", "verdict"), targets(rows)),
        "",
        "## What the mechanism leaves of each ratio target (issue 23)",
        "",
        "Any recorder built on a Python function mode and saved-tensor hooks pays at least what "
        "those cost with no bookkeeping at all (`mechanism alone`: an empty `TorchFunctionMode` "
        "and no-op hooks, interleaved with the other variants). `left per event` is the host "
        "time per recorded event the target leaves above that: (target - mechanism) x untracked "
        "step / events. `ours per event now` is what tracking adds per event above the untracked "
        "step (the mechanism included). `reads alone` is the mechanism doing only what an ideal "
        "recorder could not skip (tag each new node, read each saved tensor's storage, size, "
        "version, shape and dtype; no records, lines, deaths or writes: `benchmarks/floor.py`): "
        "where it is at or above the target, no recorder that finds lines and records frees can "
        "meet it.",
        "",
        table_markdown(FLOOR_COLUMNS, floor_rows) if floor_rows else "No overhead row ran.",
        "",
        "## What ran",
        "",
    ]
    for row in rows:
        parts += [f"- **{row.key} {row.workload}**: " + "; ".join(row.details or ["-"])]
    if notes:
        parts += ["", notes.rstrip()]
    return "\n".join(parts) + "\n"
