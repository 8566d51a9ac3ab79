"""The timeline as numbers for drawing: sample positions in steps or events, min-max envelopes
per pixel column, and the live sparkline (a PNG rasterized with numpy and Pillow in a few
milliseconds, so the panel can redraw it at every live refresh). No matplotlib here."""

from __future__ import annotations

import io

import numpy

from autograd_magic.model.records import BackwardCall, TimelineSample
from autograd_magic.report.sentences import MIN_STEPS

NODES_RGB, BYTES_RGB = (0x1C, 0x7E, 0xD6), (0xE8, 0x59, 0x0C)


def x_axis(
    backward_calls: list[BackwardCall], seqs: numpy.ndarray
) -> tuple[numpy.ndarray, str, bool]:
    """Positions of the samples, an axis label, and whether they are steps: steps when the block
    called backward `MIN_STEPS` times or more (wall time is not recorded; step k ends where
    backward call k ends), else the events' order."""
    calls = [c for c in backward_calls if c.seq >= seqs[0]]
    ends = sorted({c.end_seq if c.end_seq is not None else c.seq for c in calls})
    ends = [e for e in ends if seqs[0] < e]
    if len(ends) < MIN_STEPS:
        return (
            seqs,
            "recorded events in order (ops, saves, frees; labels give the line)",
            False,
        )
    knots = numpy.array([seqs[0], *ends], dtype=float)
    x = numpy.interp(seqs, knots, numpy.arange(len(knots), dtype=float))
    width = (knots[-1] - knots[0]) / (len(knots) - 1)
    after = seqs > knots[-1]
    x[after] = len(knots) - 1 + (seqs[after] - knots[-1]) / width
    lines = sorted({c.site.outer_line or c.line for c in calls})
    at = ("line " if len(lines) == 1 else "lines ") + ", ".join(map(str, lines[:5]))
    return x, f"step (step k ends when backward call k, {at}, finishes)", True


def envelope(
    x: numpy.ndarray, y: numpy.ndarray, columns: int
) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    """(column centres, lowest, highest) of step-wise `y` over `columns` equal columns of x's
    range; a column without samples holds the value carried in from the one before."""
    edges = numpy.linspace(x[0], x[-1] if x[-1] > x[0] else x[0] + 1, columns + 1)
    first = numpy.searchsorted(x, edges[:-1], side="left")
    last = numpy.searchsorted(x, edges[1:], side="left")
    last[-1] = len(x)
    carried = y[numpy.maximum(first - 1, 0)]
    low, high = carried.copy(), carried.copy()
    # Columns tile x's range, so the samples of the non-empty columns are consecutive runs:
    # reduceat over their starts gives each column's own extremes.
    full = numpy.flatnonzero(last > first)
    if len(full):
        low[full] = numpy.minimum(low[full], numpy.minimum.reduceat(y, first[full]))
        high[full] = numpy.maximum(high[full], numpy.maximum.reduceat(y, first[full]))
    return (edges[:-1] + edges[1:]) / 2, low, high


def sparkline_png(
    samples: list[TimelineSample],
    backward_calls: list[BackwardCall],
    width: int = 800,
    rows: int = 64,
) -> bytes:
    """Live nodes (top band) and retained bytes (bottom band) as a transparent PNG, each scaled
    to its own peak: the shaded band spans each pixel column's lowest to highest value."""
    image = numpy.zeros((2 * rows + 6, width, 4), dtype=numpy.uint8)
    if samples:
        seqs = numpy.fromiter((s.seq for s in samples), float, len(samples))
        x, _, _ = x_axis(backward_calls, seqs)
        for top, values, rgb in (
            (0, (s.live_nodes for s in samples), NODES_RGB),
            (rows + 6, (s.retained_bytes for s in samples), BYTES_RGB),
        ):
            y = numpy.fromiter(values, float, len(samples))
            _, low, high = envelope(x, y, width)
            _band(image[top : top + rows], low, high, max(float(y.max()), 1.0), rgb)
    buffer = io.BytesIO()
    from PIL import Image  # matplotlib's own dependency

    Image.fromarray(image, "RGBA").save(buffer, format="png", compress_level=1)
    return buffer.getvalue()


def _band(
    out: numpy.ndarray, low: numpy.ndarray, high: numpy.ndarray, peak: float, rgb: tuple
) -> None:
    rows = out.shape[0]
    row = numpy.arange(rows)[:, None]
    top = (rows - 1 - numpy.round(high / peak * (rows - 1))).astype(int)[None, :]
    bottom = (rows - 1 - numpy.round(low / peak * (rows - 1))).astype(int)[None, :]
    out[..., :3] = rgb
    alpha = numpy.where(row >= top, 60, 0)  # the area under the curve
    alpha = numpy.where((row >= top) & (row <= bottom), 140, alpha)  # the band
    alpha = numpy.where(row == top, 255, alpha)  # the upper edge
    out[rows - 1, :, 3] = 255  # the base line
    out[: rows - 1, :, 3] = alpha[: rows - 1]
