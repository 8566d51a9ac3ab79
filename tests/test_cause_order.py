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
