"""A real browser: JupyterLab on 127.0.0.1 with a token, the quickstart opened in headless
Chromium (Debian's /usr/bin/chromium driven by Playwright), all cells run, and the panel's numbers
and finding read from the widget's own DOM node. Saves a screenshot of the panel; the README's
picture is made with `AUTOGRAD_MAGIC_SCREENSHOT=docs/panel.png python -m pytest tests/browser`.

When Chromium or Playwright is missing, the test installs them first (`.ci/setup-browser`:
apt-get chromium, pip playwright). It is skipped only when that install fails and CI is not set;
under CI it fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "examples/quickstart.ipynb"
SETUP = ROOT / ".ci" / "setup-browser"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The panel's outer VBox as ipywidgets renders it in an output area (the static text/html
# fallback renders as .jp-RenderedHTMLCommon instead, and a failed widget as a message).
WIDGET_OUTPUT = ".jp-OutputArea-output > .jupyter-widgets.widget-vbox"
PANEL_TRACES = ("leaky", "fixed")  # the quickstart's %%trackgraph -o cells, in order
SERVER_START_S = 120
RUN_S = 240


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(ok: bool, what: str) -> None:
    """Skip when a browser-test prerequisite is missing, except under CI, where it fails."""
    if ok:
        return
    message = f"{what} is missing: run .ci/setup-browser (apt-get chromium, pip playwright)"
    if on_ci():
        pytest.fail(f"CI is set and {message}")
    pytest.skip(message)


def install_browser() -> str:
    """Run .ci/setup-browser for this interpreter; its output, for the skip or failure message."""
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", str(SETUP)], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    return (done.stdout + done.stderr)[-2000:]


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value), encoding="utf-8")


class Lab:
    """A JupyterLab server in a private Jupyter home; `stop()` shuts it and its kernels down."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "JUPYTER_PREFER_ENV_PATH"):
            env.pop(name, None)
        data = self.home / "data"
        settings = self.home / "settings"
        env.update(
            JUPYTER_CONFIG_DIR=str(self.home / "config"),
            JUPYTER_DATA_DIR=str(data),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(settings),
            JUPYTERLAB_WORKSPACES_DIR=str(self.home / "workspaces"),
            IPYTHONDIR=str(self.home / "ipython"),
        )
        # The notebook's "python3" kernel runs this interpreter (the package under test).
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        spec = {"argv": argv, "display_name": "Python 3 (ipykernel)", "language": "python"}
        write_json(data / "kernels" / "python3" / "kernel.json", spec)
        # No autosave (the repository's notebook must not change), no news or update checks.
        write_json(
            settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings",
            {"autosave": False},
        )
        write_json(
            settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
            {"fetchNews": "false", "checkForUpdates": False},
        )
        # Every cell rendered, in view or not (the default skips cells scrolled out of view).
        write_json(
            settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings",
            {"windowingMode": "none"},
        )
        return env

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={ROOT}",
            f"--FileCheckpoints.root_dir={self.home / 'checkpoints'}",  # none in the repository
            "--ServerApp.terminals_enabled=False",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
        ]
        if os.geteuid() == 0:  # CI containers run as root
            command.append("--allow-root")
        env = self.environment()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"JupyterLab exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.api("status"), timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise AssertionError(f"JupyterLab did not answer in {SERVER_START_S} s:\n{self.log()}")

    def api(self, path: str) -> str:
        return f"{self.url}/api/{path}?token={self.token}"

    def log(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-4000:]

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        try:  # the server's own shutdown also shuts its kernels down
            request = urllib.request.Request(self.api("shutdown"), method="POST")
            urllib.request.urlopen(request, timeout=10).close()
            process.wait(timeout=20)
        except (urllib.error.URLError, OSError, subprocess.TimeoutExpired):
            pass
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        # Anything left in the server's own process group (a stray kernel) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if not (CHROMIUM.exists() and _importable("playwright") and _importable("jupyterlab")):
        output = install_browser()
        import importlib

        importlib.invalidate_caches()
        require(CHROMIUM.exists(), f"{CHROMIUM} (.ci/setup-browser said: {output})")
    require(CHROMIUM.exists(), str(CHROMIUM))
    require(_importable("playwright"), "the playwright Python package")
    require(_importable("jupyterlab"), "JupyterLab")
    server = Lab(tmp_path_factory.mktemp("jupyter-home"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def page(lab: Lab, tmp_path: Path) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a new, empty user data dir
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 1000},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


# ----- driving JupyterLab -----------------------------------------------------------------
def dismiss_dialogs(page: Any) -> None:
    """Answer the first-run dialogs explicitly: keep the notebook's kernel, no news."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and "kernel" in dialog.inner_text().lower():
        dialog.locator(".jp-Dialog-button.jp-mod-accept").click()  # "Select": python3
    news = page.get_by_role("button", name=re.compile(r"^No$"))
    if news.count():
        news.first.click()


def wait_for_kernel_idle(page: Any, timeout_s: float) -> None:
    """Wait for the status bar's "Python 3 (ipykernel) | Idle", answering dialogs meanwhile."""
    deadline = time.monotonic() + timeout_s
    status = page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"ipykernel.*\| Idle$"))
    while time.monotonic() < deadline:
        dismiss_dialogs(page)
        if status.count():
            return
        page.wait_for_timeout(500)
    raise AssertionError(f"the kernel was not idle within {timeout_s} s")


def menu(page: Any, top: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    entry = page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}"))
    entry.first.click()


def panel_texts(page: Any) -> list[str]:
    """Text of each rendered autograd_magic widget (not the static fallback)."""
    nodes = page.locator(WIDGET_OUTPUT).filter(has_text="autograd_magic")
    return [" ".join(nodes.nth(i).inner_text().split()) for i in range(nodes.count())]


# The lowest WCAG contrast ratio between a visible text and the background it is drawn on.
CONTRAST_JS = """
root => {
  const rgba = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = c => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const background = el => {
    for (; el; el = el.parentElement) {
      const c = rgba(getComputedStyle(el).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c;
    }
    return [255, 255, 255];
  };
  let worst = 21;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!node.textContent.trim() || !el.offsetParent) continue;
    const [a, b] = [lum(rgba(getComputedStyle(el).color)), lum(background(el))];
    worst = Math.min(worst, (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05));
  }
  return worst;
}
"""


def min_contrast(widget: Any) -> float:
    return float(widget.evaluate(CONTRAST_JS))


# The <img>'s own PNG (base64) and the background colour it is drawn on in the page.
IMAGE_JS = """
async img => {
  const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
  let text = '';
  for (const b of bytes) text += String.fromCharCode(b);
  for (let el = img; el; el = el.parentElement) {
    const c = (getComputedStyle(el).backgroundColor.match(/[\\d.]+/g) || []).map(Number);
    if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return [btoa(text), c.slice(0, 3)];
  }
  return [btoa(text), [255, 255, 255]];
}
"""


def plot_contrast(img: Any) -> tuple[float, float]:
    """For the picture as the page shows it (its PNG over the page's background): (luminance
    of the background, the best contrast against it among colours covering at least 0.2% of the
    picture: how well its axes, text and lines stand out; anti-aliased edges do not count)."""
    import base64
    import io

    from PIL import Image

    data, colour = img.evaluate(IMAGE_JS)
    picture = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGBA")
    behind = Image.new("RGBA", picture.size, (*map(int, colour), 255))
    image = Image.alpha_composite(behind, picture).convert("RGB")

    def lum(rgb: tuple[int, ...]) -> float:
        def f(c: float) -> float:
            c /= 255
            return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

        r, g, b = rgb[:3]
        return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b)

    back = lum(tuple(int(c) for c in colour))
    counts = image.getcolors(image.width * image.height)
    solid = [c for n, c in counts if n >= 0.002 * image.width * image.height]
    best = max((max(lum(c), back) + 0.05) / (min(lum(c), back) + 0.05) for c in solid)
    return back, best


def expected_numbers() -> dict[str, str]:
    """The leaky cell's headline numbers, from running its code under track() in-process."""
    import autograd_magic

    cells = json.loads((ROOT / NOTEBOOK).read_text(encoding="utf-8"))["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    setup = "\n".join(line for line in sources[0].splitlines() if not line.startswith("%"))
    (leaky,) = [s for s in sources if s.startswith("%%trackgraph -o leaky")]
    namespace: dict[str, Any] = {}
    exec(compile(setup, "setup", "exec"), namespace)
    with autograd_magic.track() as trace:
        exec(compile(leaky.split("\n", 1)[1], "leaky", "exec"), namespace)
    return dict(trace.report(block="cell").summary)


def test_quickstart_panel_renders_in_jupyterlab(lab: Lab, page: Any, tmp_path: Path) -> None:
    notebook = ROOT / NOTEBOOK
    before = hashlib.sha256(notebook.read_bytes()).hexdigest()
    expected = expected_numbers()
    try:
        # GIVEN the quickstart open in JupyterLab with its kernel started
        page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}", timeout=120_000)
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
        wait_for_kernel_idle(page, 120)
        # AND its committed outputs cleared, so only a live widget can pass below
        menu(page, "Edit", "Clear Outputs of All Cells")
        page.wait_for_timeout(500)
        assert page.locator(WIDGET_OUTPUT).count() == 0
        # WHEN all cells run
        menu(page, "Run", "Run All Cells")
        deadline = time.monotonic() + RUN_S
        while time.monotonic() < deadline:
            dismiss_dialogs(page)
            texts = panel_texts(page)
            if sum("finished" in t for t in texts) == len(PANEL_TRACES):
                break
            page.wait_for_timeout(1000)
        texts = panel_texts(page)
        # THEN both panels rendered as widgets, finished
        assert len(texts) == len(PANEL_TRACES), f"{len(texts)} panels: {texts}\n{lab.log()}"
        leaky, fixed = texts
        assert "Error displaying widget" not in " ".join(texts)
        assert leaky.startswith("autograd_magic — finished"), leaky[:200]
        # AND the leaky panel shows the numbers of that loop and the finding naming total_loss
        for label in ("Live autograd nodes", "Retained saved tensors", "Backward calls"):
            assert f"{label} {expected[label]}" in leaky, (label, expected[label], leaky[:600])
        assert "Backward calls 3" in leaky
        assert "`total_loss` keeps every iteration's graph alive" in leaky
        assert "line 7 (`total_loss += loss`)" in leaky  # named once, in the sentence
        # AND the fixed panel has no finding
        assert "keeps every iteration's graph alive" not in fixed
        assert not re.search(r"Line \d+:", fixed.split("Timeline")[0]), fixed[:600]
        # AND the panel's tabs are there
        for tab in ("Timeline", "Graph", "Buffers", "Storage", "Versions"):
            assert tab in leaky
        # AND the static copy saved beside each panel hides itself next to the live widget
        statics = page.locator(".autograd-magic-static")
        statics.nth(len(PANEL_TRACES) - 1).wait_for(state="attached", timeout=30_000)
        assert statics.count() == len(PANEL_TRACES)
        assert not any(statics.nth(i).is_visible() for i in range(statics.count()))
        # Save the picture of the leaky panel (the README's, when asked for)
        screenshot = Path(os.environ.get("AUTOGRAD_MAGIC_SCREENSHOT") or tmp_path / "panel.png")
        widget = page.locator(WIDGET_OUTPUT).filter(has_text="autograd_magic").first
        widget.scroll_into_view_if_needed()
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        widget.screenshot(path=str(screenshot))
        assert screenshot.stat().st_size > 10_000
        print(f"panel screenshot: {screenshot}")
        # AND after switching JupyterLab to its dark theme every visible text stays readable
        assert min_contrast(widget) >= 4.5
        background, ink = plot_contrast(widget.locator("img").first)
        print(f"light-theme timeline: background luminance {background:.2f}, ink {ink:.2f}:1")
        assert background > 0.8 and ink >= 3.0, (background, ink)
        menu(page, "Settings", "Theme")
        page.locator(".lm-Menu-itemLabel", has_text=re.compile("^JupyterLab Dark$")).click()
        page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
        page.wait_for_timeout(1000)
        dark = min_contrast(widget)
        widget.screenshot(path=str(tmp_path / "panel-dark.png"))
        print(f"lowest text contrast: dark theme {dark:.2f}")
        assert dark >= 4.5, f"contrast {dark:.2f} in the dark theme"
        # AND the timeline picture is no white rectangle: dark behind, its text still readable
        background, ink = plot_contrast(widget.locator("img").first)
        print(f"dark-theme timeline: background luminance {background:.2f}, ink {ink:.2f}:1")
        assert background < 0.2, f"the plot's background is light ({background:.2f})"
        assert ink >= 3.0, f"the plot's text and lines reach only {ink:.2f}:1"
    finally:
        after = hashlib.sha256(notebook.read_bytes()).hexdigest()
        assert after == before, f"{NOTEBOOK} was modified by the browser session"


REAL_MODELS = "examples/08_real_models.ipynb"
REAL_PANELS = ("train_step", "kept", "fixed")  # its %%trackgraph -o cells, in order


def open_and_run(lab: Lab, page: Any, notebook: str, panels: int) -> list[str]:
    """Open `notebook`, clear its outputs, run every cell; the finished panels' texts."""
    page.goto(f"{lab.url}/lab/tree/{notebook}?token={lab.token}", timeout=120_000)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
    wait_for_kernel_idle(page, 120)
    menu(page, "Edit", "Clear Outputs of All Cells")
    page.wait_for_timeout(500)
    menu(page, "Run", "Run All Cells")
    deadline = time.monotonic() + RUN_S
    while time.monotonic() < deadline:
        dismiss_dialogs(page)
        if sum("finished" in t for t in panel_texts(page)) == panels:
            break
        page.wait_for_timeout(1000)
    return panel_texts(page)


def set_theme(page: Any, theme: str) -> None:
    """Switch JupyterLab to "JupyterLab Light" or "JupyterLab Dark" (a saved setting: it lasts)."""
    menu(page, "Settings", "Theme")
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{theme}$")).click()
    light = "true" if theme.endswith("Light") else "false"
    page.wait_for_function(f"document.body.dataset.jpThemeLight === '{light}'", timeout=30_000)
    page.wait_for_timeout(1000)


def modules_tab(widget: Any) -> Any:
    """Select the panel's Modules tab; its content."""
    widget.locator(".lm-TabBar-tab", has_text=re.compile(r"^Modules\b")).click()
    content = widget.locator(".widget-tab-contents > :visible").first
    content.wait_for(timeout=10_000)
    return content


@contextlib.contextmanager
def left_unchanged(notebook: str) -> Iterator[None]:
    """Fail when the browser session changed the repository's `notebook` (autosave is off)."""
    path = ROOT / notebook
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    try:
        yield
    finally:
        after = hashlib.sha256(path.read_bytes()).hexdigest()
        assert after == before, f"{notebook} was modified by the browser session"


def screenshot_dir(tmp_path: Path) -> Path:
    """AUTOGRAD_MAGIC_SCREENSHOT_DIR when set, else the test's own temporary folder."""
    shots = Path(os.environ.get("AUTOGRAD_MAGIC_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    return shots


def test_modules_view_of_a_transformer_and_a_long_loop_in_both_themes(
    lab: Lab, page: Any, tmp_path: Path
) -> None:
    shots = screenshot_dir(tmp_path)
    with left_unchanged(REAL_MODELS):
        # GIVEN the real-models notebook run in JupyterLab (a tall window: whole panels in view)
        page.set_viewport_size({"width": 1280, "height": 2400})
        texts = open_and_run(lab, page, REAL_MODELS, len(REAL_PANELS))
        set_theme(page, "JupyterLab Light")  # the other test may have left it dark
        assert len(texts) == len(REAL_PANELS), f"{texts}\n{lab.log()}"
        assert all(t.startswith("autograd_magic — finished") for t in texts), texts
        widgets = page.locator(WIDGET_OUTPUT).filter(has_text="autograd_magic")
        step, kept = widgets.nth(0), widgets.nth(1)
        # THEN the transformer's summary names the attention layers
        assert "Most saved memory model.encoder.layers.*.self_attn" in texts[0], texts[0][:600]
        # WHEN the Modules tab of the transformer step and of the 1,000-step loop is opened
        for name, widget in (("transformer", step), ("long-loop", kept)):
            content = modules_tab(widget)
            text = " ".join(content.inner_text().split())
            # THEN it shows the module tree with types, shares and bytes
            if name == "transformer":
                for expected in ("TransformerEncoderLayer", "self_attn", "MultiheadAttention"):
                    assert expected in text, (expected, text[:800])
            else:
                assert "ReLU" in text and "Sequential" in text, text[:800]
                assert "2,000" in text  # calls: training and validation forwards
            widget.scroll_into_view_if_needed()
            widget.screenshot(path=str(shots / f"modules-{name}-light.png"))
            assert min_contrast(widget) >= 4.5, name
        # (every other tab too, for whoever reads the pictures)
        for name, widget in (("transformer", step), ("long-loop", kept)):
            for tab in ("Timeline", "Graph", "Buffers", "Versions"):
                widget.locator(".lm-TabBar-tab", has_text=re.compile(f"^{tab}\\b")).click()
                page.wait_for_timeout(300)
                widget.screenshot(path=str(shots / f"{tab.lower()}-{name}-light.png"))
            modules_tab(widget)
        # AND in the dark theme every text in both stays readable
        set_theme(page, "JupyterLab Dark")
        for name, widget in (("transformer", step), ("long-loop", kept)):
            widget.scroll_into_view_if_needed()
            widget.screenshot(path=str(shots / f"modules-{name}-dark.png"))
            dark = min_contrast(widget)
            print(f"{name}: lowest text contrast in the dark theme {dark:.2f}")
            assert dark >= 4.5, (name, dark)
        print(f"Modules view screenshots: {sorted(str(p) for p in shots.glob('modules-*.png'))}")
