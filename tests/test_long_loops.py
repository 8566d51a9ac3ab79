"""Long training loops stay readable: a short text report, a step-axis timeline drawn as an
envelope, and live timeline redraws that fit the panel's time budget."""

from __future__ import annotations

import gc
import io
import time
import tracemalloc

import numpy
import pytest
import torch
from matplotlib.lines import Line2D
from torch import nn

import autograd_magic
from autograd_magic.analysis.live import HELD, OLD
from autograd_magic.views import figures, series
from autograd_magic.views.panel import NUMBERS_SHARE, TracePanel
from autograd_magic.views.text import render_text

STEPS = 1000


@pytest.fixture(scope="module")
def mlp_loop() -> autograd_magic.Trace:
    """A clean 1,000-step MLP training loop (SGD), tracked."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    with autograd_magic.track(namespace={"model": model}) as trace:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
    return trace


def test_text_report_of_a_clean_1000_step_loop_fits_on_two_screens(mlp_loop):
    # GIVEN a clean 1,000-step loop WHEN its text report is rendered
    text = render_text(mlp_loop.report())
    lines = text.splitlines()
    # THEN it is under 150 lines, with one grouped sentence for the 1,000 backward calls
    assert len(lines) < 150, len(lines)
    assert "Backward calls: 1,000" in text
    (calls,) = [line for line in lines if "backward() calls" in line]
    assert "1,000 backward() calls, each released 5 saved tensors" in calls
    # AND repeated optimizer writes read as one row per parameter
    assert "1 -> 1001 (1,000 writes)" in text
    assert "(x1,000)" in text


def test_timeline_of_a_long_loop_is_an_envelope_over_steps(mlp_loop):
    # GIVEN far more samples than pixel columns WHEN the timeline is drawn
    assert len(mlp_loop.timeline) > 5000
    fig = figures.timeline_figure(mlp_loop.report().timeline)
    nodes, retained = fig.axes
    # THEN the x axis counts training steps (one per backward call), 0 to 1,000
    assert nodes.get_xlim()[1] == pytest.approx(STEPS, rel=0.1)
    assert retained.get_xlabel().startswith("step (step k ends when backward call k")
    # AND no line carries more points than the figure has pixel columns (never a solid block)
    columns = fig.get_figwidth() * fig.dpi
    lines = [a for ax in fig.axes for a in ax.get_children() if isinstance(a, Line2D)]
    assert lines and max(len(line.get_xdata()) for line in lines) <= columns
    # AND the title says what the band is; the envelope reaches the true peak
    assert "lowest to highest value within each pixel column" in nodes.get_title(loc="left")
    assert nodes.get_ylim()[1] >= mlp_loop.peak_live_nodes


def test_short_traces_keep_the_event_axis_and_exact_steps():
    # GIVEN one backward call only WHEN drawn THEN the axis is the events' order, drawn exactly
    x = torch.ones(3, requires_grad=True)
    with autograd_magic.track(namespace={}) as trace:
        x.exp().sum().backward()
    fig = figures.timeline_figure(trace.report().timeline)
    assert fig.axes[1].get_xlabel().startswith("recorded events in order")
    assert fig.axes[0].get_title(loc="left") == ""


def test_timeline_png_is_transparent_for_dark_themes(mlp_loop):
    import io

    from PIL import Image

    png = figures.figure_png(figures.timeline_figure(mlp_loop.report().timeline))
    image = Image.open(io.BytesIO(png)).convert("RGBA")
    assert image.getpixel((2, 2))[3] == 0  # the background shows through


def test_live_timeline_redraws_even_when_number_refreshes_used_their_share(mlp_loop):
    # GIVEN a live panel whose number-only refreshes have used up their share of the budget
    panel = TracePanel(mlp_loop, live_budget=0.04)
    panel._started = time.monotonic() - 100.0  # 100 s of cell time: 4 s of budget
    panel._spent_numbers = 4.0 * NUMBERS_SHARE + 1.0
    before = panel.live_renders
    # WHEN the next refresh comes THEN the timeline (its own share unused) is redrawn
    panel.timeline_image.value = b""
    panel.live_update(mlp_loop)
    assert panel.live_renders == before + 1
    assert bytes(panel.timeline_image.value).startswith(b"\x89PNG")


def test_panel_on_a_1000_step_loop_renders_quickly(mlp_loop):
    start = time.perf_counter()
    panel = TracePanel(mlp_loop)
    elapsed = time.perf_counter() - start
    assert "1,000 backward() calls" in panel.calls.value
    assert elapsed < 10.0  # ~1 s measured on a shared 2-core machine


def test_envelope_keeps_each_columns_extremes_and_carries_values_into_empty_ones():
    # GIVEN a sawtooth 0..9 repeated 100 times over x = 0..999, and 10 columns
    x = numpy.arange(1000, dtype=float)
    y = numpy.tile(numpy.arange(10, dtype=float), 100)
    _, low, high = series.envelope(x, y, 10)
    # THEN every column spans 0 to 9
    assert list(low) == [0.0] * 10 and list(high) == [9.0] * 10
    # AND with more columns than samples, empty columns hold the value carried in
    _, low, high = series.envelope(numpy.array([0.0, 10.0]), numpy.array([3.0, 5.0]), 5)
    assert list(low) == [3.0, 3.0, 3.0, 3.0, 3.0] and list(high) == [3.0, 3.0, 3.0, 3.0, 5.0]


def test_live_timeline_is_a_fast_sparkline_with_its_scales_in_words(mlp_loop):
    from PIL import Image

    # GIVEN the 1,000-step loop still running WHEN the live panel redraws its timeline
    mlp_loop.finished = False
    try:
        panel = TracePanel(mlp_loop)
        start = time.perf_counter()
        png = series.sparkline_png(mlp_loop.timeline, mlp_loop.backward_calls)
        elapsed = time.perf_counter() - start
        note = panel.timeline_note.value
    finally:
        mlp_loop.finished = True
    # THEN it takes milliseconds, is transparent, and the note gives what the bands are
    assert elapsed < 0.2  # ~10 ms measured
    picture = Image.open(io.BytesIO(png))
    assert picture.mode == "RGBA" and picture.getpixel((400, 66))[3] == 0
    assert (
        "Live, drawn after 1,000 backward calls: autograd nodes alive (blue, top: 0 to 20 peak)"
        in note
    )
    assert "0 B to 1.0 KiB peak), one step per backward call; where a pixel column" in note
    # AND the finished panel shows the full figure with no live note
    assert TracePanel(mlp_loop).timeline_note.value == ""


# ----- findings while the cell runs (issue 22, class 7) -----------------------------------
GROWING = "live autograd nodes grow by"
SPOKEN_AT = OLD + HELD  # the step end where a loop keeping every graph is first told of it


def _live_findings(keep: bool) -> tuple[list[tuple[int, str]], TracePanel]:
    """A 1,000-step loop under a live panel refreshed every 20 ms; (steps done, findings text)
    at each live render. `keep`: the loop appends each loss to `history` (the leak)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    history = []
    seen: list[tuple[int, str]] = []
    recorder = autograd_magic.track()
    panel = TracePanel(recorder.trace)

    def update(trace: autograd_magic.Trace) -> None:
        before = panel.live_renders
        panel.live_update(trace)
        if panel.live_renders > before:
            seen.append((len(trace.backward_calls), panel.findings.value))

    recorder.listen(update, 0.02)
    with recorder:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            if keep:
                history.append(loss)
    return seen, panel


def test_a_leaking_loop_shows_a_provisional_finding_within_a_few_refreshes():
    # GIVEN a 1,000-step loop that keeps every loss (and its graph) in a list
    seen, panel = _live_findings(keep=True)
    # WHEN the panel refreshes while it runs
    first = next(i for i, (steps, _) in enumerate(seen) if steps >= SPOKEN_AT)
    # THEN the growth is said at the first refresh once 4 steps are done (the graphs of steps
    # 1 and 2 still alive at the end of step 4; then at every refresh), never before, and long
    # before the loop ends (when that first refresh comes depends on the machine's load)
    steps, text = seen[first]
    assert GROWING in text, [s for s, _ in seen[:20]]
    assert not any(GROWING in earlier for _, earlier in seen[:first])
    assert steps < STEPS // 10
    assert all(GROWING in later for _, later in seen[first:])
    # AND it says how much per step, which line builds what stays, and that this is provisional
    assert "live autograd nodes grow by 8 per step" in text, text
    assert "built at line" in text
    # AND, by the refresh after, what holds them (found in a walk of a few milliseconds)
    assert "`history` holds them." in seen[first + 1][1]
    # AND the finished trace has the real finding instead
    panel.finish()
    assert GROWING not in panel.findings.value
    assert "`history` holds 1,000 tensors" in panel.findings.value


def test_a_clean_loop_shows_no_provisional_finding():
    seen, _ = _live_findings(keep=False)
    assert len(seen) >= 3
    assert not [steps for steps, text in seen if GROWING in text]


def _records_of_every_kind() -> None:
    """One step making nodes, saved buffers, alias links, an in-place write and a backward."""
    x = torch.ones(4, requires_grad=True)
    y = (x * 2).exp()
    view, detached = y.view(2, 2), y.detach()
    written = torch.ones(4)
    written.add_(1)
    y.sum().backward()
    del view, detached


def test_memory_stays_flat_once_every_record_cap_is_reached():
    """GIVEN a long loop WHEN every record list has reached its cap THEN the recorder's memory
    stops growing: records are counted, not kept (issue 31, item 6; README's Limits gives what
    the records cost at the default caps)."""
    trace_to_fill = autograd_magic.Trace(max_records=300, max_timeline=300)
    tracemalloc.start()
    try:
        with autograd_magic.track(trace=trace_to_fill) as trace:
            for _ in range(400):
                _records_of_every_kind()
            gc.collect()
            at_caps = tracemalloc.get_traced_memory()[0]
            for _ in range(3000):
                _records_of_every_kind()
            gc.collect()
            later = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    caps = [trace.nodes, trace.buffers, trace.links, trace.version_bumps, trace.backward_calls]
    assert [len(records) for records in caps] == [300] * 5
    assert trace.dropped_nodes > 0 and trace.dropped_buffers > 0 and trace.dropped_events > 0
    assert later - at_caps < 100_000, later - at_caps


def test_the_live_backward_calls_keep_up_with_the_numbers():
    """GIVEN a live panel whose timeline was drawn WHEN more backward calls are made and only the
    numbers are refreshed (the picture waits for its share of the budget) THEN the backward-call
    list already counts them, and the picture's note says when it was drawn (issue 36, item 6:
    '3 backward calls' in the numbers above a note and list saying 2)."""
    x = torch.ones(3, requires_grad=True)
    recorder = autograd_magic.track()
    panel = TracePanel(recorder.trace)
    with recorder as trace:
        for step in range(3):
            (x * 2).exp().sum().backward()
            if step == 1:
                panel._render(final=False, timeline=True)
        panel._render(final=False, timeline=False)
        calls, note = panel.calls.value, panel.timeline_note.value
    assert "3 backward() calls" in calls, calls
    assert "drawn after 2 backward calls" in note, note
    del trace
