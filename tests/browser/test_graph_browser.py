"""The graph of a kept history in a real browser: tests/browser/kept_history.ipynb (32 losses kept
in `history`) run in JupyterLab, in both themes, through Chromium as test_lab.py drives it. The
panel's Graph tab must show the very picture whose layout the notebook's last cell prints (same
PNG hash), that layout must name `history` and have no text over another text, a dot or the
figure's edge, and the picture must read on both backgrounds.

Screenshots go to AUTOGRAD_MAGIC_SCREENSHOT_DIR when set (graph-light.png, graph-dark.png).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

# (the `lab` and `page` fixtures come from test_lab.py through conftest.py)
from test_lab import (
    IMAGE_JS,
    WIDGET_OUTPUT,
    Lab,
    left_unchanged,
    min_contrast,
    open_and_run,
    screenshot_dir,
    set_theme,
)

NOTEBOOK = "tests/browser/kept_history.ipynb"
THEMES = {"JupyterLab Light": "light", "JupyterLab Dark": "dark"}


def collisions(layout: dict[str, Any]) -> list[tuple[str, str]]:
    """Texts whose extents overlap another text's, cover a dot or leave the figure."""
    texts = [(text, box) for text, box in layout["texts"] if text]
    width, height = layout["size"]
    found = []
    for i, (text, (x0, y0, x1, y1)) in enumerate(texts):
        for other, (a0, b0, a1, b1) in texts[:i]:
            if x0 < a1 and a0 < x1 and y0 < b1 and b0 < y1:
                found.append((text, other))
        if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
            found.append((text, "the figure's edge"))
        for x, y, r in layout["dots"]:
            if x0 < x + r and x - r < x1 and y0 < y + r and y - r < y1:
                found.append((text, f"the dot at ({x:.0f}, {y:.0f})"))
                break
    return found


def shown_pictures(widget: Any) -> set[str]:
    """SHA-256 of each picture visible in the panel, as the page holds it."""
    hashes = set()
    images = widget.locator("img:visible")
    for i in range(images.count()):
        data, _ = images.nth(i).evaluate(IMAGE_JS)
        hashes.add(hashlib.sha256(base64.b64decode(data)).hexdigest())
    return hashes


def luminance(rgb: Any) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(float(c)) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def label_contrast(widget: Any, sha256: str) -> tuple[float, float]:
    """(luminance of the page behind the graph picture, contrast of the labels' ink on it): the
    ink is the picture's own text colour (INK), which must be in it (the picture is mostly pale
    dots and thin grey edges, so its commonest colours say nothing of its text)."""
    import io

    from PIL import Image

    from autograd_magic.views.figures import INK

    images = widget.locator("img:visible")
    for i in range(images.count()):
        data, colour = images.nth(i).evaluate(IMAGE_JS)
        png = base64.b64decode(data)
        if hashlib.sha256(png).hexdigest() == sha256:
            break
    else:
        raise AssertionError("the graph picture is not shown")
    ink = tuple(int(INK[k : k + 2], 16) for k in (1, 3, 5))
    picture = Image.open(io.BytesIO(png)).convert("RGBA")  # text edges: INK, less opaque
    colours = picture.getcolors(picture.width * picture.height) or []
    assert sum(n for n, c in colours if c[:3] == ink and c[3] > 0) > 1000, "no label ink"
    a, b = luminance(ink), luminance(colour)
    return b, (max(a, b) + 0.05) / (min(a, b) + 0.05)


def test_kept_history_graph_names_the_holder_and_no_labels_overlap_in_both_themes(
    lab: Lab, page: Any, tmp_path: Path
) -> None:
    shots = screenshot_dir(tmp_path)
    with left_unchanged(NOTEBOOK):
        # GIVEN the kept-history notebook run in JupyterLab
        page.set_viewport_size({"width": 1280, "height": 1600})
        texts = open_and_run(lab, page, NOTEBOOK, 1)
        assert len(texts) == 1 and texts[0].startswith("autograd_magic — finished"), texts
        widget = page.locator(WIDGET_OUTPUT).filter(has_text="autograd_magic").first
        printed = page.locator(".jp-OutputArea-output", has_text="graph layout: ").last
        printed.wait_for(timeout=60_000)
        layout = json.loads(printed.inner_text().split("graph layout: ", 1)[1])
        labels = [text for text, _ in layout["texts"]]
        # THEN the graph names the list that keeps the 32 losses' graphs alive ...
        assert any("held by history (32 entries)" in label for label in labels), labels
        assert any("32 alike in this row" in label for label in labels), labels
        # ... and no text of it runs into another, a dot or the figure's edge
        assert collisions(layout) == [], collisions(layout)
        for theme, name in THEMES.items():
            # WHEN the panel's Graph tab is shown in each theme
            set_theme(page, theme)
            widget.locator(".lm-TabBar-tab", has_text=re.compile(r"^Graph\b")).click()
            page.wait_for_timeout(1000)
            widget.scroll_into_view_if_needed()
            widget.screenshot(path=str(shots / f"graph-{name}.png"))
            # THEN it shows the very picture whose layout was checked ...
            assert layout["png_sha256"] in shown_pictures(widget), name
            # ... on the theme's own background, its labels' ink readable there ...
            background, ink = label_contrast(widget, layout["png_sha256"])
            print(f"{name}: graph background luminance {background:.2f}, labels {ink:.2f}:1")
            assert (background > 0.8) if name == "light" else (background < 0.2), background
            assert ink >= 3.5, (name, ink)
            # ... and every text of the panel around it stays readable
            assert min_contrast(widget) >= 4.5, name
        print(f"graph screenshots: {sorted(str(p) for p in shots.glob('graph-*.png'))}")
