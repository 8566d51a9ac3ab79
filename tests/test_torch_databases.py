"""Issue 19: PyTorch's own test databases run the same with tracking on, case by case.

Every module of `module_db` (train, eval, inference), every op of `op_db` (all its sample and
error inputs, with gradients) and every optimizer config of `optim_db` runs in three fresh
processes (`tests/torch_databases.py`): untracked twice and tracked once, each case in its own
block. Outputs, gradients, exceptions and warnings (with the file and line they are attributed
to) must be bit-identical between the tracked and an untracked run. Cases whose two untracked
runs already differ are excluded as nondeterministic, and counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

import autograd_magic as am

pytest.importorskip("expecttest", reason="PyTorch's test databases import expecttest")

from torch_databases import compare, report, run_case

RUNNER = Path(__file__).with_name("torch_databases.py")
RUNS = ("untracked", "untracked again", "tracked")


def run_sides(db: str, out: Path) -> dict[str, dict[str, Any]]:
    """The runner's output for each of RUNS, run concurrently in fresh processes."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}

    def one(run: str) -> dict[str, Any]:
        path = out / f"{db}-{run.replace(' ', '-')}.json"
        side = run.split()[0]
        cmd = [sys.executable, str(RUNNER), "--db", db, "--side", side, "--out", str(path)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{run} run of {db} failed:\n{done.stderr[-5000:]}"
        return json.loads(path.read_text())

    with ThreadPoolExecutor(len(RUNS)) as pool:
        return dict(zip(RUNS, pool.map(one, RUNS), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("db", ["module", "op", "optim"])
def test_database_runs_the_same_tracked(db: str, tmp_path: Path) -> None:
    """GIVEN every case of one of PyTorch's test databases
    WHEN it runs untracked twice and tracked once, each in a fresh process
    THEN every case the untracked runs agree on gives the same digest tracked."""
    runs = run_sides(db, tmp_path)
    for run in runs.values():
        assert run["meta"]["autograd_magic"] == am.__file__, "the runner imported another copy"
    untracked, tracked = runs["untracked"]["cases"], runs["tracked"]["cases"]
    assert len(untracked) > 300, f"only {len(untracked)} cases ran"
    nondeterministic = compare(untracked, runs["untracked again"]["cases"])
    # Excluded only when it could be told from a run-to-run difference, and never in bulk.
    assert len(nondeterministic) < len(untracked) // 20, report(nondeterministic, len(untracked), 0)
    diffs = {
        case: how
        for case, how in compare(untracked, tracked).items()
        if case not in nondeterministic
    }
    listing = report(diffs, len(untracked), len(nondeterministic))
    assert not diffs, f"{listing}\n(the digests are in {tmp_path})"


# ----- the comparison itself can fail ----------------------------------------------------------


def _case(results: dict[str, Any]) -> None:
    x = torch.randn(3, 4, requires_grad=True)
    y = (x * 2).t()  # non-contiguous
    results["output"] = [y, y > 0, torch.complex(y, y), y.detach().to_sparse()]
    warnings.warn("from the case", UserWarning, stacklevel=1)
    y.sum().backward()
    results["grad"] = x.grad
    raise ValueError("at 0x7f00deadbeef")


def test_digests_agree_tracked_and_name_the_difference_when_perturbed() -> None:
    """GIVEN a case with non-contiguous, bool, complex and sparse outputs, a warning and a raise
    WHEN it runs untracked and tracked in this process, and one bit of a digest is changed
    THEN the two runs compare equal, and the changed one is reported with its path."""
    untracked = {"case": run_case("case", _case, tracked=False)}
    tracked = {"case": run_case("case", _case, tracked=True)}
    assert compare(untracked, tracked) == {}
    case = untracked["case"]
    assert case["raised"] == ["builtins.ValueError", "at 0x?"]
    (warning,) = case["warnings"]
    assert warning[:3] == ["UserWarning", "from the case", __file__]
    outputs = case["results"]["output"]["list"]
    assert [o["bits"][0] for o in outputs[:3]] == [[1, 4], [1, 4], [1, 4]]
    assert outputs[3]["bits"][0] == "coo"

    perturbed = json.loads(json.dumps(untracked))
    bits = perturbed["case"]["results"]["grad"]["bits"]
    bits[2] = ("0" if bits[2][0] != "0" else "1") + bits[2][1:]
    perturbed["case"]["warnings"][0][3] += 1
    diffs = compare(untracked, perturbed)
    assert list(diffs) == ["case"]
    assert [d.split(":")[0] for d in diffs["case"]] == [".warnings[0][3]", ".results.grad.bits[2]"]
    assert "1 of 1 cases differ" in report(diffs, 1, 0)


def test_a_case_run_on_one_side_only_is_a_difference() -> None:
    """GIVEN digests where one side lacks a case THEN that case is reported."""
    assert compare({"a": {}, "b": {}}, {"a": {}}) == {"b": ["ran on one side only"]}
