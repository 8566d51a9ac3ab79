"""The package layout is the pipeline: model <- recorder, model <- analysis <- report <- views <-
top.

Checked on the source itself (every `import` of an `autograd_magic` module, including imports
inside functions and under `if TYPE_CHECKING:`, with no exemption), and by importing in a fresh
process to see which heavy libraries load.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autograd_magic"
# What each layer may import besides itself. The top layer (magic, __init__, cli, ...) may
# import anything.
ALLOWED = {
    "model": set(),
    "recorder": {"model"},
    "analysis": {"model"},
    "report": {"model", "analysis"},
    "views": {"model", "report"},  # renderers lower a report
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else "top"


def imports_of(path: Path) -> set[str]:
    """Every autograd_magic module `path` imports, at run time or for type checking."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("autograd_magic"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autograd_magic"):
            base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if _is_module(candidate) else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _is_module(name: str) -> bool:
    relative = Path(*name.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").exists() or (PACKAGE / relative).is_dir()


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_import_goes_down_the_pipeline():
    """GIVEN the package's modules THEN each imports only its own layer and the ones below."""
    wrong = []
    for module, imported in import_graph().items():
        own = layer(module)
        if own == "top":
            continue
        for target in imported:
            other = layer(target)
            if other != own and other not in ALLOWED[own]:
                wrong.append(f"{module} ({own}) imports {target} ({other})")
    assert wrong == []


def test_there_are_no_import_circles():
    """GIVEN the import graph (imports inside functions included) THEN it has no cycle."""
    graph = import_graph()
    edges = {m: {t for t in targets if t in graph} for m, targets in graph.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            walk(start, [start])
    assert cycles == []


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("autograd_magic.magic", ("matplotlib", "ipywidgets", "networkx")),
        ("autograd_magic", ("matplotlib", "ipywidgets", "networkx")),
        ("autograd_magic.views.html", ("ipywidgets",)),
        ("autograd_magic.views.text", ("matplotlib", "ipywidgets", "networkx")),
    ],
)
def test_loading_imports_no_heavy_library_it_does_not_need(module, absent):
    """GIVEN a fresh interpreter WHEN a module is imported THEN the libraries only a view needs
    are not loaded (the extension loads fast; static HTML works without ipywidgets)."""
    code = f"import sys, {module}; print([m for m in {absent!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


RANK = {"model": 0, "recorder": 1, "analysis": 1, "report": 2, "views": 3, "top": 4}


def _calls_up(render) -> list[str]:
    """Run `render()` under a profiler; every call from a package function into a function of a
    higher layer (or of a sibling: recorder <-> analysis), as 'caller -> callee'."""
    seen: list[str] = []

    def layer_of(frame) -> str | None:
        name = frame.f_globals.get("__name__", "")
        return layer(name) if name.startswith("autograd_magic") else None

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = layer_of(frame)
        back = frame.f_back
        caller = None if back is None else layer_of(back)
        if callee is None or caller is None or callee == caller:
            return
        if RANK[callee] >= RANK[caller]:
            seen.append(f"{back.f_code.co_qualname} ({caller}) -> {frame.f_code.co_qualname}")

    sys.setprofile(profile)
    try:
        render()
    finally:
        sys.setprofile(None)
    return seen


def test_a_trace_goes_down_the_pipeline_once_and_never_climbs_back():
    """GIVEN a finished trace with findings, modules, shared storage and in-place writes
    WHEN the text report, the static HTML and the JSON export are made from it THEN no function
    of a lower layer calls one of a higher layer: records -> analysis -> report -> renderer."""
    import torch

    import autograd_magic as am
    from autograd_magic.report.build import report_of
    from autograd_magic.views.html import page
    from autograd_magic.views.text import render_text

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    losses = []
    with am.track() as trace:
        for _ in range(3):
            loss = model(torch.ones(2, 4)).sum()
            loss.backward()
            losses.append(loss)
        view = losses[0].detach()
        view.add_(1)
    assert trace.findings  # the report has sentences to word
    assert _calls_up(lambda: render_text(report_of(trace))) == []
    assert _calls_up(lambda: page(report_of(trace))) == []
    assert _calls_up(trace.to_json) == []
