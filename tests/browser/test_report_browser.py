"""The HTML report in a real browser: `python -m autograd_magic report` output opened from disk
in headless Chromium (Debian's /usr/bin/chromium driven by Playwright) with every network request
refused; the findings and both traces' pictures must be in the DOM, decoded.

Set AUTOGRAD_MAGIC_REPORT_SCREENSHOT=path.png to keep a screenshot of the report. Skipped when
Chromium or Playwright is missing and `.ci/setup-browser` cannot install them, except under CI.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import torch
from test_lab import CHROMIUM, CHROMIUM_ARGS, _importable, install_browser, require

import autograd_magic
from autograd_magic.saving import trace_file_text

ROOT = Path(__file__).resolve().parents[2]


def two_rank_traces(folder: Path) -> list[str]:
    names = []
    for rank, steps in enumerate((3, 6)):
        with autograd_magic.track() as trace:
            w = torch.ones(64, 64, requires_grad=True)
            losses = []
            for i in range(steps):
                loss = (w * (i + 1)).tanh().sum()
                loss.backward()
                losses.append(loss)
        run = {"rank": rank, "world_size": 2, "pid": 0, "argv": ["train.py"]}
        name = f"train.rank{rank}.trace.json"
        (folder / name).write_text(trace_file_text(trace, run))
        names.append(name)
        del losses
    return names


def test_report_opens_offline_with_findings_and_pictures(tmp_path):
    if not (CHROMIUM.exists() and _importable("playwright")):
        output = install_browser()
        importlib.invalidate_caches()
        require(CHROMIUM.exists(), f"{CHROMIUM} (.ci/setup-browser said: {output})")
    require(_importable("playwright"), "the playwright Python package")
    from playwright.sync_api import sync_playwright

    names = two_rank_traces(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "autograd_magic", "report", *names, "--html", "r.html"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    url = (tmp_path / "r.html").as_uri()
    requests: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
            context.route(
                "**/*",
                lambda route: (
                    route.continue_()
                    if route.request.url == url
                    else route.abort("blockedbyclient")
                ),
            )
            page = context.new_page()
            page.on("request", lambda request: requests.append(request.url))
            page.goto(url, wait_until="load")
            body = page.locator("body").inner_text()
            sizes = page.eval_on_selector_all(
                "img", "imgs => imgs.map(i => [i.alt, i.complete, i.naturalWidth])"
            )
            shot = os.environ.get("AUTOGRAD_MAGIC_REPORT_SCREENSHOT")
            if shot:
                page.screenshot(path=shot, full_page=True)
        finally:
            browser.close()
    outside = [r for r in requests if r != url and not r.startswith("data:")]
    assert outside == []
    assert "rank 0 (train.rank0.trace.json)" in body and "rank 1 (train.rank1.trace.json)" in body
    assert "Findings per trace" in body
    assert "`losses` holds 3 tensors" in body and "`losses` holds 6 tensors" in body
    assert [alt for alt, _, _ in sizes].count("memory timeline") == 2
    assert [alt for alt, _, _ in sizes].count("autograd graph") == 2
    assert all(complete and width > 100 for _, complete, width in sizes), sizes
