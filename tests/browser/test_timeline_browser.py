"""What the panel draws, read in a real browser: tests/browser/running_and_raising.ipynb run in
JupyterLab through Chromium as test_lab.py drives it.

- While a cell runs, the live sparkline's note agrees with the numbers above it (issue 36, item
  6: "418 now / 418 peak" and 3 backward calls above a note saying "0 to 288 peak" and 2 calls).
- The timeline of a cell that raises right after a graph is freed and a backward runs has its
  labels ("freed L3", "backward L5", "error L5") apart and inside the picture (issue 36, item 5);
  the panel shows the very picture whose layout the notebook's last cell prints.
- The Graph tab's caption reads as plain words (issue 36, item 7), and a table's note wraps
  inside the panel while a wide table scrolls in its own box.

Screenshots go to AUTOGRAD_MAGIC_SCREENSHOT_DIR when set (running.png, raised.png, caption.png).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

from test_graph_browser import shown_pictures

# (the `lab` and `page` fixtures come from test_lab.py through conftest.py)
from test_lab import (
    RUN_S,
    WIDGET_OUTPUT,
    Lab,
    dismiss_dialogs,
    left_unchanged,
    menu,
    panel_texts,
    screenshot_dir,
    wait_for_kernel_idle,
)

NOTEBOOK = "tests/browser/running_and_raising.ipynb"
PANELS = 2  # its %%trackgraph cells: `running`, then `failed`

# Every HTML widget's text in the first panel, read at one moment (hidden tabs included).
READ_PANEL_JS = """
root => Array.from(root.querySelectorAll('.widget-html-content'))
  .map(el => el.textContent.replace(/\\s+/g, ' ').trim()).join(' | ')
"""


def number(pattern: str, text: str) -> int | None:
    found = re.search(pattern, text)
    return int(found.group(1).replace(",", "")) if found else None


def live_reading(text: str) -> dict[str, int | None]:
    """The numbers a reader compares: the summary's above, the note's below them."""
    return {
        "backward": number(r"Backward calls\s*([\d,]+)", text),
        "peak": number(r"Live autograd nodes\s*[\d,]+ now / ([\d,]+) peak", text),
        "listed": number(r"Line \d+: ([\d,]+) backward\(\) calls", text),
        "drawn_after": number(r"drawn after ([\d,]+) backward call", text),
        "note_peak": number(r"blue, top: 0 to ([\d,]+) peak", text),
    }


def read_while_running(
    page: Any, widget: Any, shot: Path | None = None
) -> list[dict[str, int | None]]:
    """Readings of the running panel, each taken when two reads 80 ms apart agree (a refresh
    lands as one message per widget: between them, one widget may be a refresh ahead); a
    screenshot of the third saved at `shot`."""
    readings = []
    deadline = time.monotonic() + RUN_S
    while time.monotonic() < deadline:
        first = widget.evaluate(READ_PANEL_JS)
        page.wait_for_timeout(80)
        second = widget.evaluate(READ_PANEL_JS)
        if "finished" in second:
            break
        if first == second and "running" in first and "Live, drawn after" in first:
            readings.append(live_reading(first))
            if len(readings) == 3 and shot is not None:
                widget.screenshot(path=str(shot))
    return readings


def overlaps(layout: dict[str, Any]) -> list[tuple[str, str]]:
    """Labels that overlap another label or leave the picture."""
    width, height = layout["size"]
    found = []
    for text, (x0, y0, x1, y1) in layout["texts"]:
        if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
            found.append((text, "the picture's edge"))
    for (a, (x0, y0, x1, y1)), (b, (p0, q0, p1, q1)) in itertools.combinations(layout["texts"], 2):
        if x0 < p1 and p0 < x1 and y0 < q1 and q0 < y1:
            found.append((a, b))
    return found


def test_the_live_note_agrees_with_the_numbers_and_the_raised_timeline_labels_stay_apart(
    lab: Lab, page: Any, tmp_path: Path
) -> None:
    shots = screenshot_dir(tmp_path)
    with left_unchanged(NOTEBOOK):
        # GIVEN the notebook open in JupyterLab, its outputs cleared
        page.set_viewport_size({"width": 1280, "height": 2000})
        page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}", timeout=120_000)
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
        wait_for_kernel_idle(page, 120)
        menu(page, "Edit", "Clear Outputs of All Cells")
        page.wait_for_timeout(500)
        # WHEN every cell runs, the first panel read again and again while its cell runs
        menu(page, "Run", "Run All Cells")
        running = page.locator(WIDGET_OUTPUT).filter(has_text="autograd_magic").first
        deadline = time.monotonic() + RUN_S
        while not running.count() and time.monotonic() < deadline:
            dismiss_dialogs(page)
            page.wait_for_timeout(100)
        readings = read_while_running(page, running, shots / "running.png")
        # THEN the panel was seen live several times with its sparkline's note ...
        assert len(readings) >= 3, readings
        for reading in readings:
            assert None not in reading.values(), reading
            # ... whose picture was drawn at most as late as the numbers above it were read,
            assert reading["drawn_after"] <= reading["backward"], reading
            assert reading["note_peak"] <= reading["peak"], reading
            # ... the list of backward calls counting as the summary does,
            assert reading["listed"] == reading["backward"], reading
            # ... and a note drawn after as many backward calls as the numbers count gives the
            # numbers' peak (it was drawn with them), never an older one
            if reading["drawn_after"] == reading["backward"]:
                assert reading["note_peak"] == reading["peak"], reading
        assert readings[-1]["backward"] > readings[0]["backward"], readings  # it did run on
        deadline = time.monotonic() + RUN_S
        while time.monotonic() < deadline:
            dismiss_dialogs(page)
            texts = panel_texts(page)
            if len(texts) == PANELS and "Stopped by RuntimeError" in texts[1]:
                break
            page.wait_for_timeout(500)
        printed = page.locator(".jp-OutputArea-output", has_text="timeline layout: ").last
        printed.wait_for(timeout=60_000)
        layout = json.loads(printed.inner_text().split("timeline layout: ", 1)[1])
        texts = panel_texts(page)
        assert len(texts) == PANELS, texts
        assert texts[0].startswith("autograd_magic — finished"), texts[0][:200]
        # AND the raised cell's timeline marks the free, the backward and the error ...
        labels = [text for text, _ in layout["texts"]]
        for start in ("freed L3", "backward L5", "error L5"):
            assert start in labels, labels
        # ... with no label over another or past the picture's edge
        assert overlaps(layout) == [], overlaps(layout)
        # AND the raised panel's Timeline tab shows that very picture
        raised = page.locator(WIDGET_OUTPUT).filter(has_text="autograd_magic").nth(1)
        raised.scroll_into_view_if_needed()
        assert layout["png_sha256"] in shown_pictures(raised)
        raised.screenshot(path=str(shots / "raised.png"))
        # WHEN the first panel's Graph tab is opened
        running.locator(".lm-TabBar-tab", has_text=re.compile(r"^Graph\b")).click()
        caption = running.locator(".widget-html-content", has_text="nodes shown as").first
        caption.wait_for(timeout=30_000)
        words = " ".join(caption.inner_text().split())
        running.scroll_into_view_if_needed()
        running.screenshot(path=str(shots / "caption.png"))
        # THEN its caption reads as plain words: one sentence, one colon, no code names
        assert re.fullmatch(r"[\d,]+ nodes shown as [\d,]+ boxes: [^:]+\.", words), words
        assert "one box per module" in words, words
        for slip in ("creating line", "node type", "levels of graph beneath it", ": repeated"):
            assert slip not in words, (slip, words)
        assert not re.search(r"\b\w+Backward\d\b", words), words
        print(f"graph caption: {words}")
        # WHEN its Buffers tab, whose saved-tensor table is wider than the panel, is opened
        running.locator(".lm-TabBar-tab", has_text=re.compile(r"^Buffers\b")).click()
        note = running.locator("div", has_text=re.compile(r"^Sizes add tensor by tensor")).last
        note.wait_for(timeout=30_000)
        # THEN the table scrolls in its own box and the note under a table wraps inside the
        # panel (it ran on past the panel's edge, cut off: the transformer's screenshots)
        widths = running.evaluate(
            "root => Array.from(root.querySelectorAll('table'))"
            ".map(t => [t.parentElement.scrollWidth, t.parentElement.clientWidth])"
        )
        assert any(wide > shown for wide, shown in widths), widths
        edge, panel = note.bounding_box(), running.bounding_box()
        assert edge["x"] + edge["width"] <= panel["x"] + panel["width"], (edge, panel)
