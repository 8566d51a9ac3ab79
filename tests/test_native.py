"""The compiled recorder (autograd_magic._native) records exactly what the pure-Python one does.

Every differential scenario runs tracked twice, with the extension and with the pure-Python
fallback (`native.NATIVE` set aside, as `AUTOGRAD_MAGIC_PURE_PYTHON=1` does at import): the user
sees the same results, errors and freeing order, and the traces' JSON is identical; so are the
traces every example notebook keeps, each side in a fresh process. CI builds the
extension (`pip install -e .`), so there a missing build fails instead of skipping.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import sysconfig
import weakref
from pathlib import Path

import pytest
import torch
from scenarios import FREES_AFTER_CAUGHT_EXCEPTIONS, assert_same, run_tracked
from test_differential import SCENARIOS

import autograd_magic as am
from autograd_magic.recorder import native

# PyTorch's anomaly mode warns in both runs of the scenario that enables it.
pytestmark = pytest.mark.filterwarnings("ignore:Error detected in:UserWarning")

COMPILED = native.NATIVE
ROOT = Path(__file__).resolve().parent.parent
needs_native = pytest.mark.skipif(
    COMPILED is None and not os.environ.get("CI"), reason=f"recorder: {native.STATUS}"
)


def _json(trace: am.Trace | None) -> dict:
    assert trace is not None
    document = json.loads(trace.to_json())
    for buffer in document["buffers"]:
        buffer["storage_key"] = 0  # a memory address: differs between runs
    return document


def test_ci_builds_the_compiled_recorder():
    """GIVEN CI's install (`pip install -e .`) WHEN the package loads THEN the extension is used
    (outside CI, a machine without a compiler is allowed the fallback)."""
    if os.environ.get("CI") and not os.environ.get(native.PURE_PYTHON_ENV):
        assert COMPILED is not None, native.STATUS


@needs_native
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_compiled_and_pure_python_recorders_give_the_same_trace(scenario, gc_disabled, monkeypatch):
    """GIVEN a differential scenario WHEN tracked with the compiled recorder and with the
    pure-Python one THEN the user sees the same run and the traces' JSON is identical."""
    assert COMPILED is not None, native.STATUS
    run_tracked(scenario)  # warm-up: first calls into torch build caches
    compiled = run_tracked(scenario)
    monkeypatch.setattr(native, "NATIVE", None)
    pure = run_tracked(scenario)

    assert pure.error == compiled.error
    assert pure.log == compiled.log
    assert_same(compiled.results, pure.results)
    assert pure.alive_after == compiled.alive_after
    if FREES_AFTER_CAUGHT_EXCEPTIONS:  # not on Python 3.12+: see scenarios
        assert pure.alive_after == []
    assert _json(pure.trace) == _json(compiled.trace)


_SCRIPT = """
import json, torch
import autograd_magic as am
from autograd_magic.recorder import native
def helper(x):
    return (x * 2).sin()
x = torch.randn(4, requires_grad=True)
with am.track() as trace:
    for _ in range(3):
        y = helper(x).tanh()
    y.sum().backward()
doc = json.loads(trace.to_json())
for b in doc["buffers"]:
    b["storage_key"] = 0
print(json.dumps({"status": native.STATUS, "trace": doc}))
"""


@needs_native
def test_the_environment_variable_forces_the_pure_python_recorder(tmp_path):
    """GIVEN the same script WHEN run with AUTOGRAD_MAGIC_PURE_PYTHON=1 and without
    THEN the first runs pure Python, the second the extension, and both traces are identical."""
    script = tmp_path / "script.py"
    script.write_text(_SCRIPT)

    def run(pure: bool) -> dict:
        env = {k: v for k, v in os.environ.items() if k != native.PURE_PYTHON_ENV}
        if pure:
            env[native.PURE_PYTHON_ENV] = "1"
        out = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout)

    pure, compiled = run(pure=True), run(pure=False)
    assert pure["status"].startswith("pure Python")
    assert compiled["status"].startswith("compiled")
    assert pure["trace"] == compiled["trace"]


_EXAMPLES_SCRIPT = """
import gc, json, random, sys
import numpy as np, nbformat, torch
from IPython.core.interactiveshell import InteractiveShell
import autograd_magic as am
from autograd_magic.recorder import native

gc.disable()  # freeing moments are compared as users see them with gc off
shell = InteractiveShell.instance()
found, failed = {}, []
for path in sys.argv[1:]:
    shell.reset(new_session=True)
    torch.manual_seed(0); random.seed(0); np.random.seed(0)
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = cell.source
        if source.startswith("%%trackgraph"):  # no live panel: refreshes depend on the clock
            source = source.replace("%%trackgraph", "%%trackgraph --no-live --text", 1)
        result = shell.run_cell(source)
        if not result.success and "raises-exception" not in cell.metadata.get("tags", []):
            failed.append((path, source.splitlines()[0]))
    found[path] = {}
    for name, value in shell.user_ns.items():
        if isinstance(value, am.Trace):
            document = json.loads(value.to_json())
            for buffer in document["buffers"]:
                buffer["storage_key"] = 0  # a memory address
            found[path][name] = document
print("@@traces@@" + json.dumps({"status": native.STATUS, "failed": failed, "traces": found}))
"""


@needs_native
def test_every_example_notebook_records_the_same_traces_with_and_without_the_extension(
    tmp_path,
):
    """GIVEN every example notebook, its cells run in order (panels rendered at the end)
    WHEN run in a fresh process with the compiled recorder and in one with the pure-Python one
    THEN every trace the notebooks keep has the same JSON (storage addresses aside)."""
    script = tmp_path / "examples.py"
    script.write_text(_EXAMPLES_SCRIPT)
    notebooks = sorted(str(p) for p in (ROOT / "examples").glob("*.ipynb"))

    def run(pure: bool) -> dict:
        env = {k: v for k, v in os.environ.items() if k != native.PURE_PYTHON_ENV}
        env["PYTHONHASHSEED"] = "0"
        if pure:
            env[native.PURE_PYTHON_ENV] = "1"
        out = subprocess.run(
            [sys.executable, str(script), *notebooks],
            env=env,
            cwd=ROOT / "examples",
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(out.stdout.split("@@traces@@", 1)[1])

    compiled, pure = run(pure=False), run(pure=True)
    assert compiled["status"].startswith("compiled") and pure["status"].startswith("pure")
    assert compiled["failed"] == pure["failed"] == []
    assert sum(len(t) for t in compiled["traces"].values()) >= 25
    for notebook, traces in compiled["traces"].items():
        assert traces == pure["traces"][notebook], notebook


def _recorded_trace() -> am.Trace:
    x = torch.randn(4, requires_grad=True)
    with am.track() as trace:
        (x * 2).sin().sum().backward()
    return trace


@needs_native
def test_compiled_recorder_leaves_records_out_of_the_cycle_collector(monkeypatch):
    """GIVEN a block recorded with the compiled recorder and one with the pure-Python one WHEN
    their records are inspected THEN the compiled one's records are untracked by the cycle
    collector (they hold no cycle; a large block costs the user's collections nothing), the
    pure-Python one's are tracked, and an untracked record is freed when dropped."""
    compiled = _recorded_trace()
    records = [*compiled.nodes, *compiled.buffers, *compiled.timeline]
    assert records and not any(gc.is_tracked(r) for r in records)
    monkeypatch.setattr(native, "NATIVE", None)
    pure = _recorded_trace()
    assert all(gc.is_tracked(r) for r in [*pure.nodes, *pure.buffers])

    assert COMPILED is not None
    probe = COMPILED.untrack(type("Probe", (), {})())
    assert not gc.is_tracked(probe)
    gone = weakref.ref(probe)
    del probe
    assert gone() is None  # reference counting frees it as before


def _collector_objects_per_node() -> float:
    """Objects the cycle collector tracks, added per recorded node while a tracked graph of 400
    nodes is alive, beyond what the same graph adds untracked (gc off: nothing moves)."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(200):
            y = (y * 1.0001).sin()
        return y

    x = torch.randn(8, requires_grad=True)
    forward(x).sum().backward()  # warm-up
    gc.collect()
    before = len(gc.get_objects())
    untracked = forward(x)
    bare = len(gc.get_objects()) - before
    del untracked
    gc.collect()
    before = len(gc.get_objects())
    with am.track() as trace:
        graph = forward(x)
        grown = len(gc.get_objects()) - before
        del graph
    return (grown - bare) / trace.nodes_created


@needs_native
def test_a_live_tracked_graph_leaves_the_users_collections_as_rare_as_they_were(
    gc_disabled, monkeypatch
):
    """GIVEN a graph of 400 nodes built under tracking WHEN it is alive THEN the compiled
    recorder adds fewer than 3 collector-tracked objects per node (the node's Python wrapper
    and saved storages, which torch keeps once read; tags, metadata dicts and packed buffers are
    untracked), where the pure-Python one adds 8: each survives into the oldest generation, and
    their number is what brings the user's full collections (~85 ms each with torch) sooner."""
    assert _collector_objects_per_node() < 3
    monkeypatch.setattr(native, "NATIVE", None)
    assert _collector_objects_per_node() > 7


_FALLBACK_SCRIPT = """
import torch, autograd_magic as am
from autograd_magic.recorder import native
with am.track() as trace:
    (torch.ones(2, requires_grad=True) * 2).sum().backward()
print(native.STATUS.split(" (")[0], trace.nodes_created, am.__file__, sep="|")
"""


def test_an_install_without_a_compiler_works_with_one_warning(tmp_path):
    """GIVEN a machine whose C compiler fails WHEN the package is installed (`pip install .`)
    THEN the install succeeds without the extension, and importing it warns once, at the user's
    import, and records with the pure-Python recorder."""
    target = tmp_path / "target"
    env = dict(os.environ, CC="/bin/false", CXX="/bin/false")
    env.pop(native.PURE_PYTHON_ENV, None)
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
    done = subprocess.run(
        [*install, str(ROOT)], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not list((target / "autograd_magic").glob("_*.so"))  # neither _native nor _counted
    # -S: no .pth files, so an editable install of this checkout cannot supply the extension.
    path = os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]])
    run = subprocess.run(
        [sys.executable, "-S", "-W", "default", "-c", _FALLBACK_SCRIPT],
        env=dict(env, PYTHONPATH=path),
        cwd=tmp_path,  # not the checkout: `-c` puts the working directory first on the path
        capture_output=True,
        text=True,
        check=True,
    )
    status, nodes, where = run.stdout.strip().split("|")
    assert (status, nodes) == ("pure Python", "3") and where.startswith(str(target))
    assert run.stderr.count("compiled recorder is not in use") == 1, run.stderr
    # On the user's import line (line 2 of the script), not on a line of the package.
    assert "<string>:2: RuntimeWarning: autograd_magic's compiled recorder" in run.stderr
