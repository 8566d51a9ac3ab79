"""Other projects' own test suites, run untracked and tracked (every test's setup, call and
teardown inside `autograd_magic.track()`) in fresh pytest processes: each test must end the same
way, with the same failure text.

Only suites shipped inside an installed package can run here (CI reaches package registries, not
repositories): einops ships `einops.tests`. A suite whose library is not installed is skipped
(none is a dependency). The larger suites taken from repositories are run by
tests/suites/run_suite.py by hand; tests/suites/BASELINE.md records them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

# Fresh processes per suite: part of CI; `-m "not slow"` leaves them out while developing.
pytestmark = pytest.mark.slow

sys.path.insert(0, str(Path(__file__).resolve().parent / "suites"))

from run_suite import compare_suite, render  # noqa: E402  (tests/suites is not a package)


def test_einops_suite_ends_the_same_tracked(tmp_path: Path, monkeypatch) -> None:
    """GIVEN einops' shipped tests on the torch and numpy backends
    WHEN they run untracked and tracked
    THEN every test ends the same way with the same text, and no block is left installed."""
    if importlib.util.find_spec("einops") is None:
        pytest.skip("einops is not installed")
    monkeypatch.setenv("EINOPS_TEST_BACKENDS", "torch,numpy")
    # The torch.compile tests take most of the time (twice as long tracked); test_compile.py
    # covers compiling inside a block.
    args = ["--pyargs", "einops.tests", "-k", "not torch_compile"]
    result = compare_suite(args, tmp_path, tmp_path / "out", source="einops.tests")
    counts = result["counts"]
    assert counts["plain"]["passed"] > 40, render(result, "einops.tests")
    assert not result["differences"], render(result, "einops.tests")
    assert not result["left_installed"], render(result, "einops.tests")


SYNTHETIC = """
import pytest
import torch
from torch.overrides import _get_current_function_mode_stack


@pytest.fixture
def modes():
    at_setup = len(_get_current_function_mode_stack())
    yield at_setup
    assert len(_get_current_function_mode_stack()) == at_setup, "teardown ran outside a block"


def test_same():
    assert torch.ones(2).sum() == 2


def test_fails_the_same():
    assert torch.ones(2).sum() == 3, "two is not three"


def test_sees_a_block(modes):
    assert modes == 0 and not _get_current_function_mode_stack(), "inside a block"
"""


def test_runner_names_what_differs_and_nothing_else(tmp_path: Path) -> None:
    """GIVEN a suite with a test that passes, one that fails, and one that fails only inside a
    block (it sees the recorder's function mode in setup and call)
    WHEN run_suite compares it untracked and tracked
    THEN only the last is a difference, and the failure that happens in both is not."""
    (tmp_path / "test_synthetic.py").write_text(SYNTHETIC)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    result = compare_suite(["test_synthetic.py"], tmp_path, tmp_path / "out", plain_twice=True)
    assert result["counts"]["plain"]["passed"] == 2
    assert result["counts"]["plain-again"]["passed"] == 2
    assert result["counts"]["tracked"]["passed"] == 1
    changed = [d["test"] for group in result["differences"] for d in group]
    assert changed == ["test_synthetic::test_sees_a_block"], render(result, "synthetic")
    assert not result["unstable"] and not result["left_installed"]
