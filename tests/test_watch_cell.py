"""Long loops in a `%%trackgraph` cell (issue 34): with the default options (the first 20 steps
in full, the rest counted, escalation on), the findings are those `--full` gives (kind, holder,
line), for the findings corpus's loops run for 40 steps (`tests/findings_corpus.py` names where
each came from), and a bug that starts after the first 20 steps. Row 19 of the benchmarks times
such a cell (`benchmarks/long_cell.py`)."""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output

from autograd_magic.magic import CELL_FULL_STEPS, last_trace
from autograd_magic.watch_trace import WatchTrace

STEPS = 40
SETUP = """\
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(8, 6), torch.randn(8, 1)) for _ in range({steps})]
"""
CELLS = {
    # findings corpus loss_history: losses.append(loss)
    "loss-history": """\
losses = []
for x, y in data:
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss)
""",
    # findings corpus total_loss_tensor: total_loss += loss
    "total-loss": """\
total_loss = 0
for x, y in data:
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    total_loss += loss
""",
    # findings corpus logger_keeps_loss: a logger given the loss tensor
    "logger": """\
class Logger:
    def __init__(self):
        self.history = []

    def log(self, value):
        self.history.append(value)

logger = Logger()
for x, y in data:
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    logger.log(loss)
""",
    # examples/08_real_models.ipynb: validation outputs collected with grad on
    "validation-outputs": """\
x_val = torch.randn(8, 6)
val = []
for x, y in data:
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.step()
    val.append(model(x_val))
""",
    # findings corpus gru_cell_no_detach "fixed" with retain_graph=True (the cell frozen)
    "carried-state": """\
cell, head = nn.GRUCell(6, 8), nn.Linear(8, 1)
cell.requires_grad_(False)
head_opt = torch.optim.Adam(head.parameters(), lr=1e-2)
state = torch.zeros(8, 8, requires_grad=True)
for x, y in data:
    state = cell(x, state)
    loss = F.mse_loss(head(state), y)
    head_opt.zero_grad()
    loss.backward(retain_graph=True)
    head_opt.step()
""",
    # loss_history with the bug behind a condition, starting after the first 20 steps
    "late-loss-history": """\
losses = []
for step, (x, y) in enumerate(data):
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if step >= 30:
        losses.append(loss)
""",
    # findings corpus kept_logits: validation without no_grad after training, outputs kept
    "kept-logits": """\
for x, y in data:
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.step()
all_outputs = []
for x, _y in data:
    output = model(x)
    all_outputs.append(output)
preds = torch.cat(all_outputs).argmax(1)
""",
    # a correct loop: the losses kept as numbers
    "correct": """\
losses = []
for x, y in data:
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
""",
}


def _findings(shell, options: str, cell: str) -> tuple[object, set[tuple[str, str, int]]]:
    shell.run_cell(SETUP.format(steps=STEPS))
    with capture_output():
        result = shell.run_cell(f"%%trackgraph {options}\n{cell}")
    result.raise_error()
    trace = last_trace()
    return trace, {(f.kind, f.holder, f.line) for f in trace.findings}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CELLS))
def test_a_long_cell_finds_by_default_what_full_capture_finds(shell, name):
    """GIVEN a 40-step loop in a `%%trackgraph` cell WHEN run with the default options and with
    --full THEN both give the same findings (kind, holder, line); the default counted the steps
    past the first 20."""
    full_trace, full = _findings(shell, "--full", CELLS[name])
    watched, found = _findings(shell, "", CELLS[name])
    assert isinstance(watched, WatchTrace) and watched.steps_done == STEPS
    assert watched.windows[0].steps_text == f"steps 1-{CELL_FULL_STEPS}"
    assert len(full_trace.backward_calls) == STEPS
    assert found == full
    assert bool(full) == (name != "correct")


def test_a_long_cell_is_watched_by_default(shell):
    """GIVEN a 40-step cell keeping its losses, default options THEN the first 20 steps are a
    window and its findings name `losses` at the line that keeps them."""
    watched, found = _findings(shell, "", CELLS["loss-history"])
    assert isinstance(watched, WatchTrace) and watched.steps_done == STEPS
    assert ("kept-alive", "losses", 7) in found
