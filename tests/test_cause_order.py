"""Issue 35 in a notebook: a crashed cell says the crash's cause before the graphs the crash
left unused, a retain_graph=True on each of several losses comes before what it keeps alive,
and a problem inside a function defined in a cell is said at that function's line."""

from __future__ import annotations

from IPython.utils.capture import capture_output

CRASH = """\
w = torch.rand(4, 4, requires_grad=True)
for step in range(2):
    h = (w * 2).exp().sum()
    out = w.sigmoid()
    out.mul_(2)
    out.sum().backward()
    h.backward()
"""


def run(shell, cell: str):
    with capture_output() as captured:
        result = shell.run_cell(cell)
    return result, captured


def test_a_crash_is_said_before_the_graphs_it_left_unused(shell):
    # GIVEN a cell whose step crashes before the backward that would use `h`
    result, _ = run(shell, "%%trackgraph --text -o tr\n" + CRASH)
    # WHEN it runs THEN the cell fails as it does untracked
    assert not result.success
    found = shell.user_ns.pop("tr").findings
    # THEN the write that caused the crash comes first, the graph it left unused after it
    assert [(f.kind, f.line) for f in found] == [("inplace-on-saved", 5), ("unused-graph", 3)]
    assert "the error at line 6 ended the step" in found[1].message
    assert "no_grad" not in found[1].message
    shell.user_ns.pop("w", None)
    shell.user_ns.pop("h", None)
    shell.user_ns.pop("out", None)


RETAIN_EACH = """\
w = torch.rand(4, 4, requires_grad=True)
total = 0
for step in range(3):
    y = (w @ w).exp()
    loss1 = y.mean()
    loss2 = y.pow(2).mean()
    loss1.backward(retain_graph=True)
    loss2.backward(retain_graph=True)
    total += loss1 + loss2
"""


def test_retain_graph_on_each_loss_comes_before_what_it_keeps(shell):
    # GIVEN a cell passing retain_graph=True to each loss while `total` chains the graphs
    result, _ = run(shell, "%%trackgraph --text -o tr\n" + RETAIN_EACH)
    assert result.success
    found = shell.user_ns.pop("tr").findings
    # THEN the retain is the cause, and `total` follows from it
    assert [(f.kind, f.line, f.holder) for f in found] == [
        ("retained-graph", 8, "loss2"),
        ("kept-alive", 9, "total"),
    ]
    assert "because backward(retain_graph=True) at line 8" in found[1].message
    for name in ("w", "total", "y", "loss1", "loss2", "step"):
        shell.user_ns.pop(name, None)


NET = """\
import torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.bias = nn.Parameter(torch.zeros(8))
    def forward(self, x):
        out = torch.sigmoid(self.fc1(x))
        out += self.bias
        return out.sum()
"""
LOOP = """\
model = Net()
for step in range(2):
    loss = model(torch.rand(4, 6))
    loss.backward()
"""
CELL_NAMES = ("nn", "Net", "model", "step", "loss")


def test_a_write_in_a_forward_defined_in_the_cell_is_said_at_its_own_line(shell):
    # GIVEN a cell defining a module whose forward adds a bias in place to sigmoid's output
    result, _ = run(shell, "%%trackgraph --text -o tr\n" + NET + LOOP)
    assert not result.success
    (found,) = shell.user_ns.pop("tr").findings
    # THEN the finding is at the write in forward (line 9), the call (line 13) as context,
    # the local named with its function, and no line said twice
    assert (found.kind, found.line, found.holder) == ("inplace-on-saved", 9, "out")
    assert found.related_lines == (8, 13)
    assert "`out` in `Net.forward` at line 9 (`out += self.bias`), called at line 13" in (
        found.message
    )
    assert "saved for backward at line 8;" in found.message
    assert "tensor#" not in found.message
    for name in CELL_NAMES:
        shell.user_ns.pop(name, None)


def test_a_line_of_an_earlier_cell_says_which_cell(shell):
    # GIVEN the module defined in one cell and trained in the next
    assert shell.run_cell(NET, store_history=True).success
    net_cell = shell.execution_count - 1
    result, captured = run(shell, "%%trackgraph --text -o tr\n" + LOOP)
    assert not result.success
    (found,) = shell.user_ns.pop("tr").findings
    # THEN the finding points at this cell's call and says where the write is
    assert (found.kind, found.line, found.holder) == ("inplace-on-saved", 3, "out")
    assert f"at line 9 in cell In [{net_cell}] (`out += self.bias`), called at line 3" in (
        found.message
    )
    # AND the Buffers table says which cell a saved tensor's line is in
    assert f"line 8 of cell In [{net_cell}]" in captured.stdout
    for name in CELL_NAMES:
        shell.user_ns.pop(name, None)


FREED_IN_A_FUNCTION = """\
w = torch.rand(3, requires_grad=True)
kept = []
def finish():
    loss = torch.cat(kept).sum()
    loss.backward()
for step in range(2):
    kept.append((w * 2).exp())
    finish()
"""


def test_a_backward_in_a_function_says_each_line_once(shell):
    # GIVEN a cell whose function backpropagates a list never emptied (REINFORCE-style)
    result, _ = run(shell, "%%trackgraph --text -o tr\n" + FREED_IN_A_FUNCTION)
    assert not result.success
    (found,) = shell.user_ns.pop("tr").findings
    # THEN the finding is at the backward in `finish`, called at line 8, each line said once
    assert (found.kind, found.line) == ("backward-through-freed", 5)
    assert "at line 5 of `finish`, called at line 8, needs" in found.message
    assert found.message.count("line 8") == 1, found.message
    for name in ("w", "kept", "finish", "step"):
        shell.user_ns.pop(name, None)


RETAIN_IN_A_FUNCTION = """\
w = torch.rand(3, requires_grad=True)
def step():
    loss = (w * 2).exp().sum()
    loss.backward(retain_graph=True)
    return loss
loss = step()
"""


def test_a_retain_inside_a_function_is_said_at_its_own_line(shell):
    # GIVEN a function of the cell that passes retain_graph=True, its loss kept by the cell
    result, _ = run(shell, "%%trackgraph --text -o tr\n" + RETAIN_IN_A_FUNCTION)
    assert result.success
    (found,) = shell.user_ns.pop("tr").findings
    # THEN the finding is at the backward's own line (4), not the call (6)
    assert (found.kind, found.line, found.holder) == ("retained-graph", 4, "loss")
    for name in ("w", "step", "loss"):
        shell.user_ns.pop(name, None)
