"""Plain records of watch mode's counted steps (issue 34): what the counters said at a step's end,
and what autograd held at one moment (for an out-of-memory post-mortem).

Plain data only (ints, strings, shapes), as every record: they round-trip through JSON.
"""

from __future__ import annotations

import dataclasses
import itertools
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from autograd_magic.model.records import HeldBy


@dataclass(frozen=True)
class StepCounts:
    """The cheap counters at the end of one counted step.

    `live_roots`: backward roots (the `grad_fn` of each tensor a backward started from) whose
    node is still alive: a loop that keeps its graphs (`losses.append(loss)`) adds one a step.
    `live_saved`: saved tensors autograd still holds. `retained_bytes`: bytes of the distinct
    storages those hold that nothing else holds (not parameters or the user's leaves), at the
    step's end; `peak_bytes`: the most of them at any moment within the step."""

    step: int
    backward_calls: int
    live_roots: int
    live_saved: int
    retained_bytes: int
    peak_bytes: int
    captured: bool = False


# A step's fields in a `StepLog` row, in `StepCounts` order.
_FIELDS = tuple(f.name for f in dataclasses.fields(StepCounts))
_ROW = len(_FIELDS)
_ROOTS, _RETAINED = 2, 4


class StepLog(Sequence[StepCounts]):
    """Every step's counters, seven integers a step in one array (no object per counted step),
    read as `StepCounts` made when read. `add()` is the counted steps' path."""

    __slots__ = ("_rows",)

    def __init__(self, steps: Iterable[StepCounts] = ()) -> None:
        self._rows = array("q")
        for counts in steps:
            self.append(counts)

    def add(self, step: int, calls: int, roots: int, saved: int, retained: int, peak: int) -> None:
        """A counted step's end."""
        self._rows.extend((step, calls, roots, saved, retained, peak, 0))

    def append(self, counts: StepCounts) -> None:
        self._rows.extend(
            (
                counts.step,
                counts.backward_calls,
                counts.live_roots,
                counts.live_saved,
                counts.retained_bytes,
                counts.peak_bytes,
                int(counts.captured),
            )
        )

    def rose_at_last(self, period: int = 1) -> bool:
        """Whether live roots or retained bytes rose at the last step end since the step end
        `period` steps before it (read in place)."""
        rows = self._rows
        if len(rows) < (period + 1) * _ROW:
            return False
        last = len(rows) - _ROW
        before = last - period * _ROW
        return (
            rows[last + _ROOTS] > rows[before + _ROOTS]
            or rows[last + _RETAINED] > rows[before + _RETAINED]
        )

    def thin(self, head: int) -> int:
        """Keep the first `head` steps, then every captured step, every other counted one and
        the last; return how many were dropped (memory stays flat however long the run)."""
        rows, count = self._rows, len(self)
        kept = rows[: head * _ROW]
        rest = count - head
        for i in range(rest):
            start = (head + i) * _ROW
            if i % 2 == 0 or i == rest - 1 or rows[start + _ROW - 1]:
                kept.extend(rows[start : start + _ROW])
        self._rows = kept
        return count - len(self)

    def as_lists(self) -> list[list[int | bool]]:
        """Each step as the list of its fields (`captured` a bool): the JSON form."""
        rows = self._rows
        return [
            [*rows[start : start + _ROW - 1], bool(rows[start + _ROW - 1])]
            for start in range(0, len(rows), _ROW)
        ]

    @property
    def nbytes(self) -> int:
        """Bytes the rows take (8 a field, 56 a step, plus the array's spare room)."""
        return self._rows.buffer_info()[1] * self._rows.itemsize

    def column(self, name: str) -> list[int]:
        """One field of every step, in step order ('live_roots', 'captured' as 0/1, ...)."""
        return list(self._rows[_FIELDS.index(name) :: _ROW])

    def _at(self, index: int) -> StepCounts:
        step, calls, roots, saved, retained, peak, captured = self._rows[
            index * _ROW : (index + 1) * _ROW
        ]
        return StepCounts(step, calls, roots, saved, retained, peak, bool(captured))

    def __len__(self) -> int:
        return len(self._rows) // _ROW

    @overload
    def __getitem__(self, index: int) -> StepCounts: ...

    @overload
    def __getitem__(self, index: slice) -> list[StepCounts]: ...

    def __getitem__(self, index: int | slice) -> StepCounts | list[StepCounts]:
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(len(self)))]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("step index out of range")
        return self._at(index)

    def __iter__(self) -> Iterator[StepCounts]:
        return (self._at(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepLog):
            return self._rows == other._rows
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StepLog({list(self)!r})"


@dataclass(frozen=True)
class HeldSaved:
    """One storage autograd's saved tensors hold now: its bytes, the first tensor saved from it
    (shape, dtype), the watched block's line and the top-level module running when it was
    saved ("" outside any module), and who else holds it ("" for the graph alone)."""

    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    line: int
    module: str
    held_by: HeldBy


@dataclass(frozen=True)
class WatchOptions:
    """What a watch captures in full: the `first` steps, every `every`th step (0: none), and
    `capture_steps` steps once the growth signal has risen at `escalate_after` consecutive step
    ends (at most `max_windows` windows in all)."""

    first: int = 1
    every: int = 0
    escalate_after: int = 3
    capture_steps: int = 3
    max_windows: int = 4


@dataclass
class CaptureWindow:
    """Steps `first_step` to `last_step` recorded in full, and why (`reason`); `trace` (a
    `Trace`) is their record. `planned_steps`: how many were asked for."""

    first_step: int
    last_step: int
    planned_steps: int
    reason: str
    trace: Any

    @property
    def steps_text(self) -> str:
        """'step 4' or 'steps 4-6'; 'the ops after step 3' (or 'the ops from the start') when
        no step ended in it (it is still recording, or no backward came after it opened)."""
        if self.last_step < self.first_step:
            after = self.first_step - 1
            return f"the ops after step {after:,}" if after else "the ops from the start"
        if self.last_step == self.first_step:
            return f"step {self.first_step}"
        return f"steps {self.first_step}-{self.last_step}"


@dataclass(frozen=True)
class OutOfMemory:
    """What autograd held when memory ran out: saved bytes by line and by top-level module
    (largest first), the saved tensors and backward roots alive, and the last steps' counters."""

    error: str
    step: int
    retained_bytes: int
    saved_tensors: int
    live_roots: int
    by_line: tuple[tuple[int, int], ...]
    by_module: tuple[tuple[str, int], ...]
    last_steps: tuple[StepCounts, ...]
    holders: tuple[str, ...] = ()
    modules_off: str = ""  # why `by_module` was not recorded ("": it was)

    @classmethod
    def of(
        cls,
        error: str,
        held: Sequence[HeldSaved],
        live_roots: int,
        last_steps: tuple[StepCounts, ...],
        step: int,
        holders: tuple[str, ...] = (),
        modules_off: str = "",
    ) -> OutOfMemory:
        """The post-mortem of `held` (only what graphs alone hold is counted)."""
        graphs_only = [h for h in held if not h.held_by]
        by_line: dict[int, int] = {}
        by_module: dict[str, int] = {}
        for h in graphs_only:
            by_line[h.line] = by_line.get(h.line, 0) + h.nbytes
            by_module[h.module] = by_module.get(h.module, 0) + h.nbytes
        return cls(
            error=error,
            step=step,
            retained_bytes=sum(h.nbytes for h in graphs_only),
            saved_tensors=len(held),
            live_roots=live_roots,
            by_line=tuple(sorted(by_line.items(), key=lambda kv: -kv[1])),
            by_module=()
            if modules_off
            else tuple(sorted(by_module.items(), key=lambda kv: -kv[1])),
            last_steps=last_steps,
            holders=holders,
            modules_off=modules_off,
        )


@dataclass
class WatchRecord:
    """Everything a watched block left: its options, every step's counts, the capture windows,
    the out-of-memory post-mortem (or None), the error that ended it (or None)."""

    options: WatchOptions = field(default_factory=WatchOptions)
    steps: StepLog = field(default_factory=StepLog)
    windows: list[CaptureWindow] = field(default_factory=list)
    out_of_memory: OutOfMemory | None = None
    error: str | None = None
    finished: bool = False
    modules_off: str = ""  # why saved bytes stopped being attributed to modules ("": they were)


# Saved bytes are attributed to the top-level module running "where that is cheap" (issue 34):
# the global module hooks that tell which one runs cost about MODULE_CALL_COST_S of host time
# per module call (measured: a 1,000-step loop of a 4-module MLP, 0.27 ms a step, paid 23 us a
# step for them). After MODULE_WARM_STEPS counted steps, the median CPU time of the next
# MODULE_CHECK_STEPS decides: attribution stops when the hooks would cost more than
# MODULE_SHARE of a step. A BERT or CNN step keeps it, a tiny step does not.
MODULE_CALL_COST_S = 6e-6
MODULE_SHARE = 0.02
MODULE_WARM_STEPS = 2
MODULE_CHECK_STEPS = 5


def module_hooks_too_costly(calls: int, step_seconds: float) -> str:
    """Why module attribution should stop where a step of `step_seconds` makes `calls` module
    calls, or "" to keep it."""
    cost = calls * MODULE_CALL_COST_S
    if step_seconds <= 0 or cost <= MODULE_SHARE * step_seconds:
        return ""
    return (
        f"its hooks would have cost about {cost / step_seconds:.0%} of each step "
        f"({calls:,} module calls in a {step_seconds * 1e3:.2f} ms step)"
    )


# Step records a growth check reads back from a step end, at most: the rule costs the same at
# step 100,000 of a long leak as at step 10.
LOOKBACK = 200


def growth_start(
    steps: Sequence[StepCounts], after: int, period: int = 1
) -> tuple[str, int] | None:
    """What rose ('live backward roots' or 'retained saved tensors') at each of the last `after`
    step ends, past the most it reached before that rise, and the step where that unbroken rise
    began; None when neither did (a correct loop ends its steps alike). A loop with several
    backward calls per iteration (`period`, see `repeat_period`: DCGAN's three) is read at the
    step ends of one phase of its iterations (every `period`-th step end back from the last):
    within an iteration the counts rise and fall, from one iteration to the next they stay
    flat. A rise that goes no higher than an earlier one is the same pattern again, not
    growth."""
    if period > 1:
        if len(steps) <= after * period:
            return None
        if isinstance(steps, StepLog) and not steps.rose_at_last(period):
            return None
        reach = (after + 2 * LOOKBACK + 2) * period
        phase = steps[max(0, len(steps) - reach) :][::-1][::period][::-1]
        return growth_start(phase, after)
    if after < 1 or len(steps) <= after:
        return None
    if isinstance(steps, StepLog):
        if not steps.rose_at_last():
            return None  # the usual step end, read in place
    else:
        last, previous = steps[-1], steps[-2]
        if (
            last.live_roots <= previous.live_roots
            and last.retained_bytes <= previous.retained_bytes
        ):
            return None  # the usual step end: nothing rose at the last one
    for what, read in (("live backward roots", _roots), ("retained saved tensors", _retained)):
        values = [read(s) for s in steps[-after - 1 :]]
        if not all(b > a for a, b in itertools.pairwise(values)):
            continue
        first = len(steps) - after
        stop = max(1, len(steps) - LOOKBACK)
        while first > stop and read(steps[first - 1]) > read(steps[first - 2]):
            first -= 1
        before = steps[max(0, first - 1 - LOOKBACK) : first - 1]
        if before and max(read(s) for s in before) >= values[-1]:
            continue
        return what, steps[first].step
    return None


# Saved bytes, in units of the most a counted step saved, that may pile up past the last step
# end with no backward call before a window opens (outputs kept with their graphs after the last
# backward: one step's forward, a validation batch or two, stay under it).
PILE_STEPS = 3

# Backward calls one loop iteration may make (a WGAN-GP's critic steps and more).
MAX_PERIOD = 8


def repeat_period(values: Sequence[Any], max_period: int = MAX_PERIOD) -> int:
    """The smallest p for which the last values (two iterations' worth at most) repeat every p
    (1 for a plain loop's backward lines, 3 for DCGAN's D-real, D-fake, G calls). Where no
    period up to `max_period` fits, `max_period`: a slower answer, never a wrong one."""
    recent = list(values)[-2 * max_period :]
    for p in range(1, max_period + 1):
        if all(recent[i] == recent[i - p] for i in range(p, len(recent))):
            return p
    return max_period


def _roots(counts: StepCounts) -> int:
    return counts.live_roots


def _retained(counts: StepCounts) -> int:
    return counts.retained_bytes


# Out-of-memory errors: CUDA's (a subclass of RuntimeError), and the CPU allocator's text.
_OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_out_of_memory(error: BaseException) -> bool:
    """True for `torch.OutOfMemoryError` and the CPU allocator's out-of-memory RuntimeError."""
    if type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(t in text for t in _OOM_TEXTS)


def captured_counts(counts: StepCounts, retained_bytes: int, peak_bytes: int) -> StepCounts:
    """`counts` of a captured step, with the bytes the recorder's trace saw (its hooks were
    innermost, so the counter did not)."""
    return dataclasses.replace(
        counts, captured=True, retained_bytes=retained_bytes, peak_bytes=peak_bytes
    )
