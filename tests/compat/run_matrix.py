"""Run the package's tests on other torch and Python releases, one venv per cell (not CI).

Each cell gets a fresh venv (pyenv's interpreter, `torch==X` from the registry with the machine's
pip constraint lifted, the package's dependencies and the test tools), the package installed
non-editable from `git archive REF` (so edits in the working tree meanwhile change nothing), and
three runs: the fast suite (`-m "not slow"`, without the differential tests and the browser
tests), the differential tests, and `smoke.py`. Results go to `results/<cell>.json`; `--table`
prints COMPAT.md's table from them. A venv this script built is removed after its cell (they
are 5-7 GB each) unless `--keep`.

    python tests/compat/run_matrix.py                          # every cell
    python tests/compat/run_matrix.py --cells 3.11-2.4.1 3.10-2.4.1
    python tests/compat/run_matrix.py --cells 3.11-2.13.0 --venv .venv   # an existing venv
    python tests/compat/run_matrix.py --table
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = HERE / "results"
CELLS = [
    "3.11-2.4.1",
    "3.11-2.8.0",
    "3.11-2.11.0",
    "3.11-2.13.0",
    "3.11-2.15.0",
    "3.10-2.4.1",
    "3.13-2.15.0",
    "3.12-2.14.0",
]
# What the package and its tests import, besides torch (the `test` extra's heavy libraries,
# transformers, lightning, jupyterlab and playwright, are left out: their tests skip).
DEPENDENCIES = [
    "ipython>=8",
    "ipywidgets>=8",
    "networkx>=3",
    "matplotlib>=3.7",
    "numpy",
    "pytest>=8",
    "nbclient>=0.10",
    "nbformat>=5.9",
    "ipykernel>=6",
    "expecttest",
    "setuptools>=64",
    "nbconvert",  # tests/test_examples.py runs the README's `jupyter nbconvert --execute`
    "wheel",
]
# Test paths not run in a cell, and why.
IGNORED = {
    "tests/browser": "needs Chromium and playwright (CI runs them on Python 3.11 + torch 2.13)",
}
SUITE_TIMEOUT_S = 3600
PARTS = ["fast", "differential", "smoke"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="*", default=CELLS, help="PYTHON-TORCH, e.g. 3.11-2.4.1")
    parser.add_argument("--ref", default="HEAD", help="the commit to test (git archive REF)")
    parser.add_argument("--venv-root", default="/work/matrix", type=Path)
    parser.add_argument("--venv", type=Path, help="use this existing venv (one cell; kept)")
    parser.add_argument("--keep", action="store_true", help="keep the venvs this run builds")
    parser.add_argument(
        "--parts", nargs="*", default=PARTS, choices=PARTS, help="what to run in each cell"
    )
    parser.add_argument("--table", action="store_true", help="print COMPAT.md's table and stop")
    args = parser.parse_args()
    if args.table:
        print(table())
        return 0
    RESULTS.mkdir(exist_ok=True)
    commit = _git("rev-parse", "--short", args.ref)
    for cell in args.cells:
        python, torch_version = cell.split("-")
        venv = args.venv or args.venv_root / f"py{python}-torch{torch_version}"
        built = args.venv is None and not (venv / "bin" / "python").exists()
        started = time.monotonic()
        try:
            if args.venv is None:
                build_venv(venv, python, torch_version)
            result = run_cell(venv, args.ref, args.parts)
        finally:
            if built and not args.keep:
                shutil.rmtree(venv, ignore_errors=True)
        result.update(cell=cell, commit=commit, date=_today(), minutes=_minutes(started))
        path = RESULTS / f"{cell}.json"
        earlier = json.loads(path.read_text()) if path.exists() else {}
        if earlier.get("commit") == commit:  # parts run separately at the same commit add up
            result = {**earlier, **result}
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"{cell}: {summary_line(result)}", flush=True)
    return 0


def build_venv(venv: Path, python: str, torch_version: str) -> None:
    """A venv with pyenv's `python`, `torch==torch_version` and DEPENDENCIES (a venv that has
    that torch already only gets what it misses)."""
    # The machine's pip constraint caps torch below the newest release; a matrix venv lifts it.
    env = dict(os.environ, PIP_CONSTRAINT="/dev/null", PIP_NO_CACHE_DIR="1")
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    check = "import sys, torch; sys.exit(torch.__version__.split('+')[0] != sys.argv[1])"
    if (venv / "bin" / "python").exists() and _ok(
        [venv / "bin" / "python", "-c", check, torch_version]
    ):
        subprocess.run([*pip, *DEPENDENCIES], check=True, env=env)
        return
    shutil.rmtree(venv, ignore_errors=True)
    versions = sorted(os.listdir(Path.home() / ".pyenv" / "versions"))
    full = next(v for v in versions if v.startswith(python + "."))
    shim = Path.home() / ".pyenv" / "shims" / f"python{python}"
    subprocess.run([shim, "-m", "venv", venv], check=True, env=dict(os.environ, PYENV_VERSION=full))
    subprocess.run([*pip, "--upgrade", "pip"], check=True, env=env)
    subprocess.run([*pip, f"torch=={torch_version}"], check=True, env=env)
    subprocess.run([*pip, *DEPENDENCIES], check=True, env=env)


def run_cell(venv: Path, ref: str, parts: list[str]) -> dict:
    """Install the package from `git archive ref` into `venv`, then run `parts` (a part not run
    is left out of the result)."""
    python = venv / "bin" / "python"
    result: dict = {
        "python": _output([python, "-c", "import platform; print(platform.python_version())"]),
        "torch": _output([python, "-c", "import torch; print(torch.__version__)"]),
    }
    with tempfile.TemporaryDirectory(prefix="am-matrix-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        archive = subprocess.run(
            ["git", "-C", ROOT, "archive", ref], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", src], input=archive.stdout, check=True)
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "."],
            cwd=src,
            check=True,
            env=dict(os.environ, PIP_CONSTRAINT="/dev/null", PIP_NO_CACHE_DIR="1"),
        )
        # What the install left in the copy (`build/`, with the compiled recorder) would be
        # reused by the tests that install the package again; the copy gets the installed
        # package's compiled recorder instead, for the tests that run it from the copy (the
        # command line's subprocesses, with the copy's root first on their path).
        shutil.rmtree(src / "build", ignore_errors=True)
        for info in src.glob("*.egg-info"):
            shutil.rmtree(info)
        where = "import autograd_magic, os; print(os.path.dirname(autograd_magic.__file__))"
        installed = Path(_output([python, "-c", where], cwd=tmp))
        for compiled in installed.glob("_native*.so"):
            shutil.copy(compiled, src / "autograd_magic")
        ignore = [f"--ignore={path}" for path in IGNORED]
        if "fast" in parts:
            fast = ["-m", "not slow", *ignore, "--ignore=tests/test_differential.py"]
            result["fast"] = pytest(venv, src, Path(tmp), "fast", fast)
        if "differential" in parts:
            differential = ["tests/test_differential.py"]
            result["differential"] = pytest(venv, src, Path(tmp), "differential", differential)
        if "smoke" in parts:
            smoke = subprocess.run(
                [python, HERE / "smoke.py"], cwd=tmp, capture_output=True, text=True, timeout=600
            )
            output = (smoke.stdout + smoke.stderr)[-3000:]
            result["smoke"] = {"ok": smoke.returncode == 0, "output": output}
    return result


def pytest(venv: Path, src: Path, tmp: Path, name: str, args: list[str]) -> dict:
    """Run pytest in the source copy against the installed package; counts and failures."""
    report = tmp / f"{name}.xml"
    # bin/pytest, not `python -m pytest`: the latter puts the copy's root first on sys.path, and
    # the tests would import its uncompiled package instead of the installed one.
    command = [
        venv / "bin" / "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "faulthandler_timeout=600",
        "--continue-on-collection-errors",
        f"--junitxml={report}",
        *args,
    ]
    # The repository's other top-level packages (`benchmarks`, imported by a few tests) are
    # reached through links, so that the package itself is only the installed one.
    links = tmp / "path"
    if not links.exists():
        links.mkdir()
        for package in src.iterdir():
            if (package / "__init__.py").exists() and package.name != "autograd_magic":
                (links / package.name).symlink_to(package)
    env = dict(os.environ, PYTHONPATH=str(links))
    try:
        run = subprocess.run(
            command, cwd=src, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S, env=env
        )
        tail = (run.stdout + run.stderr)[-4000:]
        returncode: int | None = run.returncode
    except subprocess.TimeoutExpired as timeout:
        tail = f"timed out after {SUITE_TIMEOUT_S} s\n" + str(timeout.stdout or "")[-4000:]
        returncode = None
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failures: list[str] = []
    skips: dict[str, int] = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            nodeid = f"{case.get('classname')}::{case.get('name')}"
            outcome = next(
                (child for child in case if child.tag in ("failure", "error", "skipped")), None
            )
            if outcome is None:
                counts["passed"] += 1
            elif outcome.tag == "skipped":
                counts["skipped"] += 1
                reason = (outcome.get("message") or "")[:120]
                skips[reason] = skips.get(reason, 0) + 1
            else:
                counts["failed" if outcome.tag == "failure" else "errors"] += 1
                message = (outcome.get("message") or "").splitlines()
                failures.append(f"{nodeid}: {message[0][:300] if message else ''}")
    # No report: pytest did not reach its end (killed from outside, or crashed).
    interrupted = not report.exists()
    return {
        **counts,
        "failures": failures,
        "skips": skips,
        "tail": tail,
        "returncode": returncode,
        "interrupted": interrupted,
    }


def summary_line(result: dict) -> str:
    return ", ".join(f"{name} {text}" for name, text in zip(PARTS, _cells(result), strict=True))


def _cells(result: dict) -> list[str]:
    """passed / failed / skipped of each pytest part, passed or failed for the smoke script;
    'not run' for a part the cell did not run."""
    cells = []
    for name in ("fast", "differential"):
        part = result.get(name)
        if part is None:
            cells.append("not run")
            continue
        failed = part["failed"] + part["errors"]
        if part["tail"].startswith("timed out"):
            cells.append("timed out")
        elif part.get("interrupted"):
            code = part.get("returncode")
            cells.append("interrupted" + ("" if code is None else f" (exit {code})"))
        else:
            cells.append(f"{part['passed']} / {failed} / {part['skipped']}")
    smoke = result.get("smoke")
    cells.append("not run" if smoke is None else "passed" if smoke["ok"] else "failed")
    return cells


def table() -> str:
    """COMPAT.md's table: one row per cell with results, in CELLS order."""
    rows = [
        "| Python | torch | date | commit | fast suite (passed / failed / skipped) "
        "| differential (passed / failed / skipped) | smoke |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in CELLS:
        path = RESULTS / f"{cell}.json"
        if path.exists():
            r = json.loads(path.read_text())
            fast, differential, smoke = _cells(r)
            rows.append(
                f"| {r['python']} | {r['torch']} | {r['date']} | {r['commit']} | {fast} "
                f"| {differential} | {smoke} |"
            )
    return "\n".join(rows)


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", ROOT, *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _ok(command: list) -> bool:
    return subprocess.run(command, capture_output=True).returncode == 0


def _output(command: list, cwd: str | None = None) -> str:
    run = subprocess.run(command, capture_output=True, text=True, check=True, cwd=cwd)
    return run.stdout.strip()


def _today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def _minutes(started: float) -> float:
    return round((time.monotonic() - started) / 60, 1)


if __name__ == "__main__":
    sys.exit(main())
