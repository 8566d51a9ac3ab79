"""Run PyTorch's own test/test_autograd.py twice, plainly and with every test inside
`autograd_magic.track()`, and list the tests that pass plainly but not when tracked.

Not collected by pytest (its name does not start with `test_`) and not run in CI: PyTorch's test
file is not part of this repository; pass its path. Usage, from the repository root:

    python tests/torch_suite/run_test_autograd.py PATH/test_autograd.py [--out DIR]
        [--timeout SECONDS] [-k EXPR] [--budget SECONDS]

Each run is a fresh `python -m pytest` in a scratch folder holding a copy of the file and an empty
pytest.ini (so this project's pytest settings do not apply), with `-p no:cacheprovider` and the
per-test `--timeout` of pytest-timeout and one pytest-xdist worker (`-n 1`, so a crash fails
one test instead of ending the run) when they are installed. The tracked run adds
`-p track_plugin`. Results come from each run's JUnit XML; `summary.json` and `summary.md` land
in the output folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OUTCOMES = ("passed", "failed", "error", "skipped")


def run_suite(test_file: Path, work: Path, mode: str, args: argparse.Namespace) -> dict:
    """Run the copied test file once under pytest in a fresh process; return its outcomes."""
    xml = work / f"{mode}.xml"
    cmd = [sys.executable, "-m", "pytest", test_file.name, "-p", "no:cacheprovider", "-q"]
    cmd += ["-rN", f"--junitxml={xml}", "-o", "junit_family=xunit1"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd.append(f"--timeout={args.timeout}")
    if importlib.util.find_spec("xdist") is not None:
        # One worker: no parallelism, but a test that kills its process (a segfault) is reported
        # as that test's failure and a fresh worker runs the rest.
        cmd += ["-n", "1"]
    if args.k:
        cmd += ["-k", args.k]
    if mode == "tracked":
        cmd += ["-p", "track_plugin"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    log = work / f"{mode}.log"
    with log.open("w") as out:
        proc = subprocess.run(
            cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=args.budget
        )
    wall = time.perf_counter() - start
    text = log.read_text(errors="replace")
    left = re.findall(r"^TRACK-LEFT-INSTALLED (\S+)", text, flags=re.M)
    return {
        "rc": proc.returncode,
        "wall_s": round(wall, 1),
        "cases": read_junit(xml),
        "left_installed": left,
    }


def read_junit(xml: Path) -> dict[str, tuple[str, str]]:
    """Map each test id to (outcome, first line of its failure, error or skip message)."""
    cases: dict[str, tuple[str, str]] = {}
    if not xml.exists():
        return cases
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                outcome = "failed" if tag == "failure" else tag
                message = first_line(child.get("message") or child.text or "")
                break
        # A teardown error adds a second entry for the same test: the worse outcome stays.
        if name not in cases or cases[name][0] in ("passed", "skipped"):
            cases[name] = (outcome, message)
    return cases


def first_line(message: str) -> str:
    """The first non-empty line of a message, shortened."""
    for line in message.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def cause(message: str) -> str:
    """A grouping key: the message with addresses, numbers and quoted names blurred."""
    key = re.sub(r"0x[0-9a-f]+", "0x?", message)
    key = re.sub(r"\d+", "N", key)
    key = re.sub(r"'[^']*'", "'?'", key)
    return key[:160]


def compare(plain: dict, tracked: dict) -> dict:
    """Counts per run and the tests whose outcome differs, grouped by the tracked error."""
    counts = {}
    for mode, run in (("plain", plain), ("tracked", tracked)):
        tally = dict.fromkeys(OUTCOMES, 0)
        for outcome, _ in run["cases"].values():
            tally[outcome] += 1
        counts[mode] = {"run": len(run["cases"]), **tally, "rc": run["rc"], "wall_s": run["wall_s"]}
    broken: dict[str, list[tuple[str, str]]] = defaultdict(list)
    other: list[tuple[str, str, str]] = []
    for name, (outcome, _) in sorted(plain["cases"].items()):
        t_outcome, t_message = tracked["cases"].get(name, ("missing", ""))
        if outcome == "passed" and t_outcome in ("failed", "error", "missing"):
            broken[cause(t_message)].append((name, t_message))
        elif outcome != t_outcome:
            other.append((name, outcome, t_outcome))
    groups = sorted(broken.items(), key=lambda item: -len(item[1]))
    return {
        "counts": counts,
        "broken": groups,
        "other_changes": other,
        "left_installed": tracked["left_installed"],
    }


def render(result: dict, source: str) -> str:
    """The comparison as Markdown."""
    header = "| run | tests | passed | failed | errors | skipped | wall s |"
    lines = [f"Source: {source}", "", header, "|---|---|---|---|---|---|---|"]
    for mode, c in result["counts"].items():
        lines.append(
            f"| {mode} | {c['run']} | {c['passed']} | {c['failed']} | {c['error']} | "
            f"{c['skipped']} | {c['wall_s']} |"
        )
    total = sum(len(tests) for _, tests in result["broken"])
    lines += ["", f"Pass untracked, fail tracked: {total}", ""]
    for _, tests in result["broken"]:
        lines.append(f"- {len(tests)} x `{tests[0][1] or '(no message)'}`")
        lines.extend(f"  - {name}" for name, _ in tests)
    if result["other_changes"]:
        lines += ["", "Other outcome changes (plain -> tracked):"]
        lines.extend(f"- {n}: {a} -> {b}" for n, a, b in result["other_changes"])
    if result["left_installed"]:
        lines += ["", "Recorder still installed after:"]
        lines.extend(f"- {n}" for n in result["left_installed"])
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--timeout", type=int, default=300, help="per test, seconds")
    parser.add_argument("--budget", type=int, default=2400, help="per run, seconds")
    parser.add_argument("-k", default="")
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="torch_suite_"))
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(args.test_file, work / "test_autograd.py")
    (work / "pytest.ini").write_text("[pytest]\n")
    runs = {
        mode: run_suite(work / "test_autograd.py", work, mode, args)
        for mode in ("plain", "tracked")
    }
    result = compare(runs["plain"], runs["tracked"])
    (work / "summary.json").write_text(json.dumps(result, indent=1))
    text = render(result, str(args.test_file))
    (work / "summary.md").write_text(text)
    print(text)
    print(f"logs and JUnit XML in {work}")


if __name__ == "__main__":
    main()
