"""Terminal IPython, typed through a pty as a user types: what the README says about it holds."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def terminal():
    ipython = Path(sys.executable).with_name("ipython")
    # The real prompt_toolkit terminal (not --simple-prompt): its auto-indent is what users meet.
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm"}
    child = pexpect.spawn(
        str(ipython),
        ["--ext", "autograd_magic", "--no-banner", "--colors=NoColor"],
        encoding="utf-8",
        timeout=90,
        env=env,
        dimensions=(40, 200),
    )
    child.expect(r"In \[1\]")
    yield child
    child.sendline("exit")
    child.close()


def _type(child, lines: list[str]) -> None:
    for line in lines:
        child.send(line + "\r")
        time.sleep(0.3)  # as typed: the prompt redraws between lines


def test_a_cell_magic_runs_after_two_empty_lines(terminal):
    """GIVEN a %%trackgraph cell typed line by line WHEN one empty line follows THEN nothing runs
    yet; WHEN a second one follows THEN the text report is printed."""
    _type(terminal, ["%%trackgraph --text", "y = torch.ones(2, requires_grad=True).exp().sum()"])
    _type(terminal, [""])
    with pytest.raises(pexpect.TIMEOUT):
        terminal.expect("Saved tensors:", timeout=3)
    _type(terminal, [""])
    terminal.expect("NameError|Saved tensors:")  # the cell ran (torch is not imported: NameError)
    terminal.expect(r"In \[2\]")


def test_a_with_block_is_indented_as_usual_and_shows_its_report(terminal):
    """GIVEN the README's terminal recipe (a `with track()` block with a loop, then show) WHEN
    typed THEN it runs and prints the text report, with no IndentationError."""
    _type(terminal, ["import torch, autograd_magic"])
    terminal.expect(r"In \[2\]")
    # The terminal indents the body itself: each line is typed without its leading spaces.
    _type(terminal, ["with autograd_magic.track() as trace:", "for _ in range(3):"])
    _type(terminal, ["loss = torch.ones(2, requires_grad=True).exp().sum()", "loss.backward()"])
    _type(terminal, ["", "", ""])
    terminal.expect(r"In \[3\]")
    _type(terminal, ["autograd_magic.show(trace)"])
    index = terminal.expect(["backward\\(\\) calls", "IndentationError", "Error"])
    assert index == 0, terminal.before
