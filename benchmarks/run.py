"""The suite's entry point: runs workloads 1-19, prints the table and rewrites BENCHMARKS.md.

`python -m benchmarks [--quick] [--output PATH] [--only KEYS]`; `python benchmarks/run.py` works
too. Hand-written analysis below the marker line of an existing BENCHMARKS.md is kept.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/run.py`: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks import (
    accuracy,
    block_exit,
    counted_steps,
    long_cell,
    long_watch,
    overhead,
    panel_cost,
    per_event,
    report,
    scale,
    script_loop,
    workloads,
)
from benchmarks.results import ONE_BLOCK_TARGET, Row, skipped, verdict

ROOT = Path(__file__).resolve().parent.parent
NOTES_MARKER = "<!-- Analysis below this line is kept when the suite rewrites this file. -->"
NO_GPU = "skipped: no GPU"
BERT = (
    "would run: Hugging Face BERT, 4 layers, hidden 128, batch 8 x 64, AdamW "
    "(pip install transformers)"
)
CUDA_CNN = "would run: workload 3's CNN, wider (64-128-256), batch 64, 64x64 images, on CUDA"
ACCURACY = (
    "would run: 8 conv blocks of width 64, batch 32, 64x64 images on CUDA; retained_bytes vs "
    "the drop of torch.cuda.memory_allocated() when the loss is deleted"
)


@dataclass(frozen=True)
class Plan:
    """How much to run: rounds per overhead workload, sizes of workloads 6 and 7."""

    warmup: int
    rounds: dict[str, int]
    steps: dict[str, int]  # steps per timed sample: samples of ~0.1 s average out scheduler noise
    million_ops: int
    panel_steps: int
    panel_rounds: int
    graph_sizes: tuple[int, ...]
    render_repeats: int
    script_steps: int  # workload 12
    script_rounds: int
    quick: bool


FULL = Plan(
    warmup=2,
    rounds={
        **{"1": 21, "2": 21, "3": 21, "4": 15, "5": 31, "9": 11, "10": 3, "11": 11},
        **{"13": 11, "14": 11, "15": 11},
    },
    steps={
        **{"1": 2, "2": 10, "3": 2, "4": 1, "5": 5, "9": 1, "10": 1000, "11": 1},
        **{"13": 2, "14": 2, "15": 4},
    },
    million_ops=1_000_000,
    panel_steps=60,
    panel_rounds=9,
    graph_sizes=(1000, 10000),
    render_repeats=3,
    script_steps=1000,
    script_rounds=5,
    quick=False,
)
QUICK = Plan(
    warmup=0,
    rounds=dict.fromkeys(["1", "2", "3", "4", "5", "9", "10", "11", "13", "14", "15"], 1),
    steps=dict.fromkeys(["1", "2", "3", "4", "5", "9", "10", "11", "13", "14", "15"], 1),
    million_ops=4_000,
    panel_steps=2,
    panel_rounds=1,
    graph_sizes=(100, 300),
    render_repeats=1,
    script_steps=3,
    script_rounds=1,
    quick=True,
)


# Issue 34: (steps, chunk) of row 18's watched loop and (steps, rounds) of row 19's cell, by
# plan.quick (the quick suite runs in CI: a few seconds each).
LONG_WATCH = {False: (100_000, 1_000), True: (2_000, 200)}
LONG_CELL = {False: (1_000, 9), True: (40, 1)}


def _overhead(build: Callable[[bool], workloads.Workload], plan: Plan) -> Row:
    workload = build(plan.quick)
    key = workload.key
    return overhead.measure(workload, plan.rounds[key], plan.warmup, plan.steps[key])


def _with_one_block(row: Row) -> list[Row]:
    """Row 10, and row 10b: its 1,000 steps all in one block (issue 23: <= 2.0x)."""
    if row.key != "10" or row.in_one_block_ratio is None:
        return [row]
    one_block = Row(
        "10b",
        "1,000 small steps in one block",
        str(row.in_one_block),
        target=f"<= {ONE_BLOCK_TARGET:.2f}x",
        verdict=verdict(row.in_one_block_ratio <= ONE_BLOCK_TARGET),
        details=["row 10's steps in one track() block (a cell holding the loop), same rounds"],
        ratio=row.in_one_block_ratio,
        floor=row.one_block_floor,
    )
    return [row, one_block]


def _bert_row(plan: Plan) -> list[Row]:
    workload = workloads.bert(plan.quick)
    if workload is None:
        why = "skipped: transformers not installed"
        return [
            skipped("11", "BERT training step (Hugging Face)", why, "<= 1.10x", BERT),
            skipped("11b", "block exit after a BERT training step", why, "<= 5 ms", BERT),
        ]
    return [
        overhead.measure(workload, plan.rounds["11"], plan.warmup, plan.steps["11"]),
        block_exit.measure(workload, plan.rounds["11"]),
    ]


def _cuda_rows(plan: Plan) -> list[Row]:
    if not torch.cuda.is_available():
        return [
            skipped("5", "CNN training step on CUDA", NO_GPU, "<= 1.10x", CUDA_CNN),
            skipped("8", "retained_bytes accuracy (CUDA)", NO_GPU, "within 1%", ACCURACY),
            *_hugging_face_cuda_skipped(NO_GPU),
        ]
    return [
        _overhead(workloads.cuda_cnn, plan),
        accuracy.measure(plan.quick),
        *_hugging_face_cuda_rows(plan),
    ]


def _hugging_face_cuda_skipped(why: str) -> list[Row]:
    return [
        skipped(
            key,
            title,
            why,
            "<= 1.15x",
            f"would run: {title[: -len(' on CUDA')]}, {layers} "
            f"layers, hidden {hidden}, batch {batch} x {tokens}, AdamW",
        )
        for key, title, _, layers, hidden, _, batch, tokens in workloads.HUGGING_FACE_CUDA
    ]


def _hugging_face_cuda_rows(plan: Plan) -> list[Row]:
    rows = []
    for key, *_ in workloads.HUGGING_FACE_CUDA:
        workload = workloads.hugging_face_cuda(key, plan.quick)
        if workload is None:
            return _hugging_face_cuda_skipped("skipped: transformers not installed")
        rows.append(overhead.measure(workload, plan.rounds[key], plan.warmup, plan.steps[key]))
    return rows


def jobs(plan: Plan) -> list[tuple[str, Callable[[], list[Row]]]]:
    """(row keys, thunk) per measurement, in table order."""
    cpu = [(w(True).key, w) for w in workloads.CPU_WORKLOADS]
    keys = {"10": "10 10b"}  # row 10's job also gives row 10b (its steps in one block)
    return [
        *(
            (keys.get(key, key), lambda build=build: _with_one_block(_overhead(build, plan)))
            for key, build in cpu
        ),
        ("11 11b", lambda: _bert_row(plan)),
        ("5 8 13 14 15", lambda: _cuda_rows(plan)),
        ("12", lambda: [script_loop.measure(plan.script_steps, plan.script_rounds)]),
        ("16", lambda: [per_event.measure(plan.quick)]),
        ("17", lambda: [counted_steps.row(plan.quick)]),
        ("17b", lambda: [counted_steps.cuda_row(plan.quick)]),
        ("18", lambda: [long_watch.measure(*LONG_WATCH[plan.quick])]),
        ("19", lambda: [long_cell.measure(*LONG_CELL[plan.quick], quick=plan.quick)]),
        ("6 6b", lambda: scale.measure(plan.million_ops, 2 if plan.quick else 21)),
        (
            "7",
            lambda: panel_cost.measure(
                plan.panel_steps,
                plan.panel_rounds,
                plan.graph_sizes,
                plan.render_repeats,
                plan.quick,
            ),
        ),
    ]


def _table_order(row: Row) -> tuple[int, str]:
    """Rows by number, then letter: 1, 2, ..., 7a, 7b, ..., 10, 11."""
    digits = "".join(c for c in row.key if c.isdigit())
    return (int(digits or 0), row.key)


def _guarded(keys: str, thunk: Callable[[], list[Row]]) -> list[Row]:
    """Run one measurement; a failure becomes an error row so the rest still runs."""
    try:
        return thunk()
    except Exception as exc:
        traceback.print_exc()
        return [
            Row(keys.split()[0], "error", f"error: {type(exc).__name__}: {exc}", verdict="error")
        ]


def _kept_notes(path: Path) -> str:
    if not path.exists():
        return NOTES_MARKER + "\n"
    text = path.read_text(encoding="utf-8")
    at = text.find(NOTES_MARKER)
    return NOTES_MARKER + "\n" if at < 0 else text[at:]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="everything once, at toy sizes")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--only", default="", help="row keys to run, e.g. '1 2 6' (prints; writes no file)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: the recorder's cost is Python on the calling "
        "thread, and one thread keeps a shared machine's scheduler from stalling parallel ops)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the suite; exit status 1 when a measurement failed."""
    args = parse(argv)
    plan = QUICK if args.quick else FULL
    torch.set_num_threads(args.threads)
    wanted = set(args.only.split())
    start, rows, where = time.perf_counter(), [], report.machine()
    for keys, thunk in jobs(plan):
        if wanted and not wanted & set(keys.split()):
            continue
        print(f"running {keys} ...", file=sys.stderr, flush=True)
        rows += _guarded(keys, thunk)
    rows.sort(key=_table_order)
    elapsed = time.perf_counter() - start
    print("\n".join(where))
    print(report.table_text(rows))
    floor_rows = report.floors(rows)
    if floor_rows:
        print("\nwhat the mechanism alone leaves of each ratio target, per recorded event:")
        print(report.text_table(report.FLOOR_COLUMNS, floor_rows))
    if not (args.no_write or wanted):
        text = report.markdown(rows, plan.quick, elapsed, where, _kept_notes(args.output))
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote {args.output}")
    print(f"suite took {elapsed:.1f} s")
    return 1 if any(r.verdict == "error" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
