"""`WatchTrace`: what a watched block leaves, as users read it: each step's counters, the
capture windows (each a full `Trace`), the out-of-memory post-mortem; its findings, report and
JSON (format 5, kind "watch")."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from autograd_magic.model.export import FORMAT
from autograd_magic.model.records import Finding
from autograd_magic.model.watch import (
    CaptureWindow,
    OutOfMemory,
    StepCounts,
    StepLog,
    WatchOptions,
    WatchRecord,
)
from autograd_magic.report.build import ReportOptions
from autograd_magic.report.watch import WatchReport, build_watch_report
from autograd_magic.trace import Trace

WATCH_VERSION = 5
MAX_STEPS = 10_000  # step records kept; past it, the oldest counted steps are thinned


class WatchTrace(WatchRecord):
    """Everything a watched block left; usable during and after the block."""

    def __init__(self, options: WatchOptions | None = None) -> None:
        super().__init__(options or WatchOptions())
        self.steps_done = 0
        self.thinned = 0  # counted steps dropped from `steps` to keep memory flat

    def add_step(self, counts: StepCounts) -> None:
        """Record one step's counters (numbered by the counter)."""
        self.steps.append(counts)
        self.steps_done = counts.step
        if len(self.steps) > MAX_STEPS:
            self._thin()

    def step_added(self, step: int) -> None:
        """Step `step`'s row was added to `steps` in place (a counted step's fast path)."""
        self.steps_done = step
        if len(self.steps) > MAX_STEPS:
            self._thin()

    def _thin(self) -> None:
        """Keep the first steps, every captured one and every other counted one after them:
        memory stays flat however long the run (the table shows the ends and windows)."""
        self.thinned += self.steps.thin(head=100)

    def finish(self, error: str | None) -> None:
        self.error = error
        self.finished = True

    @property
    def findings(self) -> list[Finding]:
        """Every capture window's findings, in window order."""
        return [f for w in self.windows for f in w.trace.findings]

    def report(self, block: str = "block") -> WatchReport:
        """The report every view shows."""
        return build_watch_report(self, ReportOptions(block=block))

    def to_json(self) -> str:
        """Format 5 ("kind": "watch"): options, steps, the post-mortem, and each window with its
        trace's own (format 4) document."""
        document = {
            "format": FORMAT,
            "version": WATCH_VERSION,
            "kind": "watch",
            "options": dataclasses.asdict(self.options),
            "finished": self.finished,
            "error": self.error,
            "steps": self.steps.as_lists(),
            "thinned": self.thinned,
            "modules_off": self.modules_off,
            "out_of_memory": None
            if self.out_of_memory is None
            else dataclasses.asdict(self.out_of_memory),
            "windows": [
                {
                    "first_step": w.first_step,
                    "last_step": w.last_step,
                    "planned_steps": w.planned_steps,
                    "reason": w.reason,
                    "trace": json.loads(w.trace.to_json()),
                }
                for w in self.windows
            ],
        }
        return json.dumps(document)

    @classmethod
    def from_json(cls, text: str) -> WatchTrace:
        """Load a format-5 watch export; raises ValueError on a bad document."""
        document = json.loads(text)
        if not isinstance(document, dict) or document.get("kind") != "watch":
            raise ValueError("not an autograd_magic watch export")
        try:
            watch = cls(WatchOptions(**document["options"]))
            watch.finished = bool(document["finished"])
            watch.error = document["error"]
            watch.steps = StepLog(StepCounts(*values) for values in document["steps"])
            watch.steps_done = watch.steps[-1].step if watch.steps else 0
            watch.thinned = int(document.get("thinned", 0))
            watch.modules_off = str(document.get("modules_off", ""))
            oom = document["out_of_memory"]
            watch.out_of_memory = None if oom is None else _out_of_memory(oom)
            watch.windows = [
                CaptureWindow(
                    w["first_step"],
                    w["last_step"],
                    w["planned_steps"],
                    w["reason"],
                    Trace.from_json(json.dumps(w["trace"])),
                )
                for w in document["windows"]
            ]
        except (KeyError, TypeError) as error:
            raise ValueError(f"not a readable watch export ({error!r})") from None
        return watch

    def __repr__(self) -> str:
        captured = sum(1 for s in self.steps if s.captured)
        return (
            f"<WatchTrace steps={self.steps_done} captured={captured} "
            f"windows={len(self.windows)} oom={self.out_of_memory is not None}>"
        )


def _out_of_memory(data: dict[str, Any]) -> OutOfMemory:
    return OutOfMemory(
        error=data["error"],
        step=data["step"],
        retained_bytes=data["retained_bytes"],
        saved_tensors=data["saved_tensors"],
        live_roots=data["live_roots"],
        by_line=tuple((int(line), int(n)) for line, n in data["by_line"]),
        by_module=tuple((str(module), int(n)) for module, n in data["by_module"]),
        last_steps=tuple(StepCounts(**s) for s in data["last_steps"]),
        holders=tuple(data["holders"]),
        modules_off=str(data.get("modules_off", "")),
    )
