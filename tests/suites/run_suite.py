"""Run another project's pytest suite twice, plainly and with every test inside
`autograd_magic.track()`, and compare the two runs test by test: outcome and failure text.

Not collected by pytest (its name does not start with `test_`). Usage, from anywhere:

    python tests/suites/run_suite.py [--cwd DIR] [--out DIR] [--timeout SECONDS]
        [--budget SECONDS] [--plain-twice] -- PYTEST_ARGS...

Each run is a fresh `python -m pytest PYTEST_ARGS` started in `--cwd` (the other project's
checkout, so its own conftest and pytest settings apply), with `-p no:cacheprovider`, a JUnit XML
report, and the per-test `--timeout` of pytest-timeout and one pytest-xdist worker (`-n 1`, so a
crash fails one test instead of ending the run) when they are installed. The tracked run adds
`-p track_plugin` (this folder's plugin: setup, call and teardown of each test each in a block).
`--plain-twice` runs the plain suite a second time first: tests whose outcome or failure text
differs between the two plain runs are listed as unstable, not as differences. `summary.json` and
`summary.md` land in `--out`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUTCOMES = ("passed", "failed", "error", "skipped")


def run_pytest(pytest_args: list[str], cwd: Path, out: Path, mode: str, opts: dict) -> dict:
    """Run pytest once in a fresh process; return its outcomes, exit code and wall time."""
    xml = out / f"{mode}.xml"
    cmd = [sys.executable, "-m", "pytest", *pytest_args, "-p", "no:cacheprovider", "-q"]
    cmd += ["-rN", f"--junitxml={xml}", "-o", "junit_family=xunit1"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd.append(f"--timeout={opts['timeout']}")
    if importlib.util.find_spec("xdist") is not None:
        # One worker: no parallelism, but a test that kills its process (a segfault) is reported
        # as that test's failure and a fresh worker runs the rest.
        cmd += ["-n", "1"]
    if mode == "tracked":
        cmd += ["-p", "track_plugin"]
    # Only the plugin's folder: autograd_magic is the one installed beside the suite's library.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    with (out / f"{mode}.log").open("w") as log:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=opts["budget"]
        )
    wall = round(time.perf_counter() - start, 1)
    return {"rc": proc.returncode, "wall_s": wall, **read_junit(xml)}


def read_junit(xml: Path) -> dict:
    """Each test id's (outcome, failure text), and the tests after which a block was left."""
    cases: dict[str, tuple[str, str]] = {}
    left: list[str] = []
    root = ET.parse(xml).getroot() if xml.exists() else ET.Element("none")
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                outcome = "failed" if tag == "failure" else tag
                message = normalise(child.get("message") or child.text or "")
                break
        left += [
            f"{name} ({p.get('value')})"
            for p in case.iter("property")
            if p.get("name") == "track_left_installed"
        ]
        # A teardown error adds a second entry for the same test: the worse outcome stays.
        if name not in cases or cases[name][0] in ("passed", "skipped"):
            cases[name] = (outcome, message)
    return {"cases": cases, "left_installed": left}


def normalise(message: str) -> str:
    """A failure text without what changes from run to run: addresses and pytest's tmp paths."""
    text = re.sub(r"0x[0-9a-fA-F]+", "0x?", message)
    text = re.sub(r"pytest-of-[^/\s]+/pytest-\d+", "pytest-of-?/pytest-?", text)
    return text.strip()[:2000]


def first_line(message: str) -> str:
    """The first non-empty line of a message, shortened."""
    for line in message.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def cause(message: str) -> str:
    """A grouping key: the first line with numbers and quoted names blurred."""
    key = re.sub(r"\d+", "N", first_line(message))
    key = re.sub(r"'[^']*'", "'?'", key)
    return key[:160]


def tally(run: dict) -> dict:
    """Counts of one run's outcomes, with its exit code and wall time."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for outcome, _ in run["cases"].values():
        counts[outcome] += 1
    return {"run": len(run["cases"]), **counts, "rc": run["rc"], "wall_s": run["wall_s"]}


def compare(runs: dict[str, dict]) -> dict:
    """Counts per run; the tests whose outcome or failure text differs tracked, grouped by the
    tracked failure's first line; the tests that differ between two plain runs (unstable)."""
    plain, tracked = runs["plain"]["cases"], runs["tracked"]["cases"]
    again = runs.get("plain-again", {}).get("cases", plain)
    unstable = sorted(name for name in plain if again.get(name) != plain[name])
    changed: dict[str, list[dict]] = defaultdict(list)
    for name in sorted(set(plain) | set(tracked)):
        before, after = plain.get(name, ("missing", "")), tracked.get(name, ("missing", ""))
        if before == after or name in unstable:
            continue
        entry = {"test": name, "plain": before[0], "tracked": after[0]}
        entry |= {"plain_text": before[1], "tracked_text": after[1]}
        changed[cause(after[1] or before[1])].append(entry)
    return {
        "counts": {mode: tally(run) for mode, run in runs.items()},
        "differences": sorted(changed.values(), key=lambda group: (-len(group), group[0]["test"])),
        "unstable": unstable,
        "left_installed": runs["tracked"]["left_installed"],
    }


def render(result: dict, source: str) -> str:
    """The comparison as Markdown."""
    header = "| run | tests | passed | failed | errors | skipped | exit | wall s |"
    lines = [f"Source: {source}", "", header, "|---|---|---|---|---|---|---|---|"]
    for mode, c in result["counts"].items():
        lines.append(
            f"| {mode} | {c['run']} | {c['passed']} | {c['failed']} | {c['error']} | "
            f"{c['skipped']} | {c['rc']} | {c['wall_s']} |"
        )
    total = sum(len(group) for group in result["differences"])
    lines += ["", f"Tests whose outcome or failure text differs tracked: {total}", ""]
    for group in result["differences"]:
        lines.append(f"- {len(group)} x `{first_line(group[0]['tracked_text']) or '(no text)'}`")
        for d in group:
            lines.append(f"  - {d['test']}: {d['plain']} -> {d['tracked']}")
            if d["plain"] == d["tracked"]:
                lines.append(f"    plain text: `{first_line(d['plain_text'])}`")
    if result["unstable"]:
        lines += ["", "Unstable between the two plain runs (not counted above):"]
        lines += [f"- {name}" for name in result["unstable"]]
    if result["left_installed"]:
        lines += ["", "Recorder still installed after:"]
        lines += [f"- {name}" for name in result["left_installed"]]
    return "\n".join(lines) + "\n"


def compare_suite(pytest_args: list[str], cwd: Path, out: Path, **opts: object) -> dict:
    """Run the suite plainly (twice with `plain_twice`) and tracked; write and return the
    comparison."""
    out.mkdir(parents=True, exist_ok=True)
    settings = {"timeout": 300, "budget": 2400} | opts
    modes = ["plain", "plain-again"] if settings.get("plain_twice") else ["plain"]
    runs = {mode: run_pytest(pytest_args, cwd, out, mode, settings) for mode in modes}
    runs["tracked"] = run_pytest(pytest_args, cwd, out, "tracked", settings)
    result = compare(runs)
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    (out / "summary.md").write_text(render(result, str(settings.get("source", cwd))))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cwd", type=Path, default=Path.cwd())
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--timeout", type=int, default=300, help="per test, seconds")
    parser.add_argument("--budget", type=int, default=2400, help="per run, seconds")
    parser.add_argument("--plain-twice", action="store_true")
    parser.add_argument("pytest_args", nargs="+")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="suite_"))
    opts = {"timeout": args.timeout, "budget": args.budget, "plain_twice": args.plain_twice}
    compare_suite(args.pytest_args, args.cwd.resolve(), out.resolve(), **opts)
    print((out / "summary.md").read_text())
    print(f"logs and JUnit XML in {out}")


if __name__ == "__main__":
    main()
