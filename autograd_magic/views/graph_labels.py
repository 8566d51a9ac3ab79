"""Labels of the graph figure: what each box's label says (op, line, bytes, who holds it) and
where labels go, right of their dot, never over another label, a dot on the same layer or the
figure's edge; boxes alike on one layer share one label for the row.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from autograd_magic.model.units import ACCUMULATE_GRAD, format_bytes
from autograd_magic.report.model import Box


def draw_labels(
    ax: Any,
    boxes: list[Box],
    xs: Sequence[float],
    ys: Sequence[float],
    sizes: Sequence[float],
    width: float,
    color: str,
) -> int:
    """Label boxes right of their dot (a chain of modules reads top to bottom), or left of it
    where the right has no room (the figure's right edge); how many were left out. Boxes a
    user's variable keeps alive go first, with the variable. Boxes alike on one layer (same op,
    line and bytes: a loop's iterations) get one label for the row when theirs would not all
    fit, with room made for it right of the row; a label that would run into another label, a
    dot on its layer or the figure's edge is left out (the panel's Node list and the text
    report's graph table still name every box)."""
    rows: dict[tuple[float, str], list[int]] = {}
    for index in sorted(range(len(boxes)), key=lambda i: (ys[i], xs[i])):
        rows.setdefault((ys[index], _box_text(boxes[index])), []).append(index)
    room = _Room(ax, xs, ys, sizes, width)
    plan = []  # (the row's boxes, the labels to try in turn, whether one label is for all)
    for (_, text), row in sorted(rows.items(), key=lambda r: not _held(boxes, r[1])):
        tries = [(i, _short_label(boxes[i])) for i in row]
        once = len(row) > 1 and not room.fits(tries)
        if once:  # one label, on the rightmost box with room
            tries = [(i, _row_label(text, [boxes[i] for i in row])) for i in reversed(row)]
        plan.append((row, tries, once))
    if room.widen([tries[0] for _, tries, once in plan if once]):
        room = _Room(ax, xs, ys, sizes, width)
    left_out = 0
    for row, tries, once in plan:
        placed = 0
        for index, label in tries:
            side = room.side(index, label)
            if side is None:
                continue
            room.take(index, label, side)
            placed += 1
            gap = math.sqrt(sizes[index]) / 2 + 4  # dot radius in points, plus a gap
            ax.annotate(
                label,
                (xs[index], ys[index]),
                xytext=(gap if side == "right" else -gap, 0),
                textcoords="offset points",
                ha="left" if side == "right" else "right",
                va="center",
                fontsize=7,
                color=color,
                zorder=4,
            )
            if once:
                break
        left_out += (0 if placed else len(row)) if once else len(row) - placed
    return left_out


class _Room:
    """Where labels can go: on each layer, the spans (in points from the axes' left) that dots
    and labels already take, and the figure's right edge."""

    def __init__(
        self,
        ax: Any,
        xs: Sequence[float],
        ys: Sequence[float],
        sizes: Sequence[float],
        width: float,
    ) -> None:
        self.ax, self.xs, self.ys, self.sizes = ax, xs, ys, sizes
        self.low, high = ax.get_xlim()
        self.axes_width = width * 72 * 0.9  # the axes span ~90% of the figure
        self.per_x = self.axes_width / ((high - self.low) or 1)
        self.right_edge = self.axes_width * 1.05  # the figure's edges, from the axes' left
        self.left_edge = -self.axes_width * 0.05
        self.taken: dict[float, list[tuple[float, float]]] = {}
        for x, y, size in zip(xs, ys, sizes, strict=True):
            centre, radius = (x - self.low) * self.per_x, math.sqrt(size) / 2
            self.taken.setdefault(y, []).append((centre - radius, centre + radius))

    def span(self, index: int, text: str, side: str = "right") -> tuple[float, float]:
        centre = (self.xs[index] - self.low) * self.per_x
        gap = math.sqrt(self.sizes[index]) / 2 + 4
        if side == "left":
            return centre - gap - _text_width(text) - 4, centre - gap
        return centre + gap, centre + gap + _text_width(text) + 4

    def fits(self, labels: list[tuple[int, str]]) -> bool:
        """Whether all of `labels` (box index, text) fit together, right of their dots."""
        placed: list[tuple[float, tuple[float, float]]] = []
        for index, text in labels:
            y, span = self.ys[index], self.span(index, text)
            if not self._free(y, span, [s for layer, s in placed if layer == y]):
                return False
            placed.append((y, span))
        return True

    def side(self, index: int, text: str) -> str | None:
        """Where one label fits: right of its dot, else left of it (a box at the right edge:
        the last of a fan-out), else nowhere."""
        for side in ("right", "left"):
            if self._free(self.ys[index], self.span(index, text, side)):
                return side
        return None

    def _free(self, y: float, span: tuple[float, float], also: Sequence = ()) -> bool:
        start, end = span
        if end > self.right_edge or start < self.left_edge:
            return False
        return not any(a < end and start < b for a, b in [*self.taken[y], *also])

    def take(self, index: int, text: str, side: str = "right") -> None:
        self.taken[self.ys[index]].append(self.span(index, text, side))

    def widen(self, labels: list[tuple[int, str]]) -> bool:
        """Stretch the x axis so each of `labels` fits right of its box (a row's label right of
        its last dot); False when none needs it or it would squeeze the drawing below half."""
        high = self.ax.get_xlim()[1]
        wanted = high
        for index, text in labels:
            share = (math.sqrt(self.sizes[index]) / 2 + 12 + _text_width(text)) / self.axes_width
            if share < 0.5:
                wanted = max(wanted, (self.xs[index] - share * self.low) / (1 - share))
        if wanted <= high:
            return False
        self.ax.set_xlim(self.low, wanted)
        return True


def _text_width(text: str) -> float:
    """Points taken by the widest line of a 7 pt label (about 0.6 em a character)."""
    return 7 * 0.6 * max(len(part) for part in text.split("\n"))


def _held(boxes: list[Box], row: list[int]) -> bool:
    return any(boxes[i].holders for i in row)


def _row_label(text: str, row: list[Box]) -> str:
    """'MseLoss L12, 32 alike in this row' / '32 B each' / who holds them."""
    first, _, rest = text.partition("\n")
    label = f"{first}, {len(row)} alike in this row" + (f"\n{rest} each" if rest else "")
    holders = [path for box in row for path in box.holders]
    return f"{label}\n{_held_by(holders)}" if holders else label


def _short_label(box: Box) -> str:
    """'Sum L4' with its bytes under it; a module: path, class, nodes and bytes on two lines;
    then the variable that keeps the box's graph alive, if any."""
    text = _box_text(box)
    return f"{text}\n{_held_by(box.holders)}" if box.holders else text


def _box_text(box: Box) -> str:
    if box.module:
        repeat = f" x{box.modules}" if box.modules > 1 else ""
        size = f", {format_bytes(box.saved_bytes)}" if box.saved_bytes else ""
        nodes = f"{len(box.members):,} node" + ("s" if len(box.members) != 1 else "")
        return f"{box.name}  {box.type}{repeat}\n{nodes}{size}"
    name = "leaf" if box.name == ACCUMULATE_GRAD else box.name.replace("Backward0", "")
    name = name.replace("Backward1", "")
    count = f" x{len(box.members)}" if len(box.members) > 1 else ""
    # The traced code's line: the last one named ('line 4 in forward, called at line 9': L9).
    line = "L" + box.where.rsplit("line ", 1)[-1]
    text = f"{name}{count} {line}" + (
        f" +{box.params} leaves" if box.params and not box.leaf else ""
    )
    return f"{text}\n{format_bytes(box.saved_bytes)}" if box.saved_bytes else text


def _held_by(paths: list[str]) -> str:
    """'held by history (32 entries), loss': who keeps the graph alive, one variable each
    (the entries of a list, dict or attribute path counted under its variable), most first."""
    entries: dict[str, list[str]] = {}
    for path in paths:
        entries.setdefault(re.split(r"[\[.]", path, maxsplit=1)[0], []).append(path)
    named = [
        paths[0] if len(paths) == 1 else f"{root} ({len(paths)} entries)"
        for root, paths in sorted(entries.items(), key=lambda e: -len(e[1]))
    ]
    more = f", +{len(named) - 2} more" if len(named) > 2 else ""
    return f"held by {', '.join(named[:2])}{more}"
