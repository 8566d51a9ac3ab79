"""`%%trackgraph` in a real IPython shell: options, usage errors, failing cells, line numbers,
`-o`, extension reload, and the live path through a fake comm."""

from __future__ import annotations

import itertools
import re
import time

import comm
import pytest
from comm import DummyComm
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import autograd_magic
from autograd_magic import display, magic
from autograd_magic.magic import await_cells
from autograd_magic.trace import Trace
from autograd_magic.views import panel as panel_module


@pytest.fixture
def panels(monkeypatch):
    """Every panel the magic builds, so tests can read its widgets."""
    made = []

    def spy(real):
        def build(*args, **kwargs):
            made.append(real(*args, **kwargs))
            return made[-1]

        return build

    # live panels come from views.panel.live_panel, the others from display's _new_panel
    monkeypatch.setattr(panel_module, "live_panel", spy(panel_module.live_panel))
    monkeypatch.setattr(display, "_new_panel", spy(display._new_panel))
    return made


def run(ip, cell: str):
    with capture_output() as captured:
        result = ip.run_cell(cell)
    return result, captured


RETAIN = """\
a = torch.rand(1, 4, requires_grad=True)
b = a ** 2
c = (b * 2).exp()
d = c.mean()
e = c.sum()
d.backward(retain_graph=True)
e.backward()
"""


def test_text_option_prints_the_report_with_cell_lines(shell):
    result, captured = run(shell, "%%trackgraph --text\n" + RETAIN)
    assert result.success
    assert captured.stdout.startswith("autograd_magic trace (finished)")
    assert (
        "Line 6: backward(retain_graph=True) released no saved tensors; the graph was kept"
        in captured.stdout
    )
    # (exp's output is `c`'s too: releasing it frees nothing while `c` lives)
    assert (
        "Line 7: backward() released 2 saved tensors, freeing no memory: something besides the "
        "graph still holds theirs." in captured.stdout
    )
    assert captured.outputs == []  # no widget with --text
    # (the graph is still held by `loss` when the cell ends: said of the cell, not of a block)
    assert "When the cell ended, " in captured.stdout


def test_panel_is_displayed_with_numbers_and_static_fallback(shell, panels):
    result, captured = run(shell, "%%trackgraph\n" + RETAIN)
    assert result.success
    (panel,) = panels
    assert "Backward calls</span><br><b>2</b>" in panel.summary.value
    assert "Line 6: backward(retain_graph=True)" in panel.calls.value
    (shown,) = captured.outputs
    assert "application/vnd.jupyter.widget-view+json" in shown.data
    assert shown.data["text/plain"].startswith("autograd_magic trace (finished)")
    assert shown.data["text/html"].count("data:image/png;base64,") == 2


@pytest.mark.parametrize(
    "options",
    [
        "--bogus",
        "--max-nodes many",
        "--max-nodes 0",
        "--refresh -1",
        "-o 1x",
        "-o class",
        "stray",
        "-o",
    ],
)
def test_bad_options_are_usage_errors_and_the_cell_does_not_run(shell, options):
    result, _ = run(shell, f"%%trackgraph {options}\nran = True\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "usage: %%trackgraph [-o NAME] [--max-nodes N]" in str(result.error_in_exec)
    assert "ran" not in shell.user_ns


def test_help_is_the_docstring(shell):
    doc = shell.find_cell_magic("trackgraph").__doc__
    assert "%%trackgraph [-o NAME] [--max-nodes N] [--no-live] [--text]" in doc
    assert "--refresh SECONDS" in doc


def test_out_stores_the_trace_and_last_trace_returns_it(shell):
    result, _ = run(shell, "%%trackgraph -o tr --text\n" + RETAIN)
    assert result.success
    assert isinstance(shell.user_ns["tr"], Trace)
    assert autograd_magic.last_trace() is shell.user_ns["tr"]
    assert len(shell.user_ns["tr"].backward_calls) == 2


def test_lines_are_cell_body_lines(shell):
    cell = """%%trackgraph -o tr --text
# line 1 is this comment

a = torch.rand(3, requires_grad=True)
b = a.exp()
def f(t):
    return t * 2
c = f(b)
c.sum().backward()
"""
    result, _ = run(shell, cell)
    assert result.success
    trace = shell.user_ns["tr"]
    names = {n.name: n for n in trace.nodes}
    assert names["ExpBackward0"].born_line == 4
    assert names["MulBackward0"].born_site.describe() == "line 6 in f, called at line 7"
    assert names["SumBackward0"].born_line == 8
    assert [b.saved_line for b in trace.buffers] == [4]
    assert trace.backward_calls[0].line == 8


def test_last_expression_is_the_cell_value(shell):
    result, _ = run(
        shell, "%%trackgraph --text\nx = torch.ones(2, requires_grad=True)\n(x * 3).sum()"
    )
    assert result.success
    assert result.result.item() == 6.0
    result, _ = run(shell, "%%trackgraph --text\ny = 1\n")
    assert result.result is None


@pytest.mark.parametrize(
    ("cell", "hidden"),
    [
        ("x = 7\nx;", True),
        ("x = 7\nx;  # hidden", True),
        ("x = 7\nx;\n# a comment\n\n", True),
        ("x = 7\nx ;  ", True),
        ("x = 7\nx  # shown;", False),
        ("x = 7\nx", False),
        ("x = [7]; x", False),
        ("x = []\nx.append(7) or x;", True),
    ],
)
def test_a_semicolon_hides_the_value_as_in_a_plain_cell(shell, cell, hidden):
    """GIVEN a cell whose last line may end with `;` WHEN run plain and under %%trackgraph THEN
    the value is shown or hidden alike (IPython's rule), and the last line runs either way."""
    with capture_output():  # stored in the history, as a kernel runs cells (IPython reads it)
        plain = shell.run_cell(cell, store_history=True)
        shell.user_ns.pop("x")
        tracked = shell.run_cell("%%trackgraph --text\n" + cell, store_history=True)
    assert tracked.success and shell.user_ns["x"] in (7, [7])  # a hidden last line still ran
    assert tracked.result == plain.result
    assert (plain.result is None) is hidden


FAILING = """\
a = torch.rand(1, 4, requires_grad=True)
e = (a * 2).exp().sum()
e.backward()
e.backward()
ran = True
"""


def test_error_cell_keeps_the_panel_and_raises_once_into_the_cell(shell, panels):
    result, captured = run(shell, "%%trackgraph -o tr\n" + FAILING)
    assert isinstance(result.error_in_exec, RuntimeError)
    assert "ran" not in shell.user_ns
    assert captured.stdout.count("Traceback (most recent call last)") == 1
    assert "----> 4 e.backward()" in captured.stdout  # the cell's own line 4
    trace = shell.user_ns["tr"]
    assert trace.error.startswith("RuntimeError: Trying to backward through the graph")
    assert trace.error_site.line == 4
    (panel,) = panels
    assert "Stopped by RuntimeError at line 4" in panel.status.value
    assert "Line 4 raised RuntimeError" in panel.findings.value
    assert "ExpBackward0#" in panel.buffers.value  # recorded up to the error
    # AND PyTorch's text is said once in the panel (issue 22, 6): the traceback has it too
    said = [panel.status.value, panel.findings.value, panel.calls.value]
    assert sum(v.count("Trying to backward through") for v in said) == 1, said
    (shown,) = captured.outputs
    assert "Line 4 raised RuntimeError" in shown.data["text/html"]


def test_keyboard_interrupt_behaves_like_an_error(shell, panels):
    cell = (
        "%%trackgraph\nx = torch.ones(2, requires_grad=True)\ny = x * 2\nraise KeyboardInterrupt\n"
    )
    result, captured = run(shell, cell)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert captured.stdout.count("KeyboardInterrupt") >= 1
    (panel,) = panels
    assert "Stopped by KeyboardInterrupt at line 3" in panel.status.value
    assert autograd_magic.last_trace().nodes_created == 2


def test_syntax_error_does_not_run_anything(shell):
    result, _ = run(shell, "%%trackgraph\nran = True\ndef (:\n")
    assert isinstance(result.error_in_exec, SyntaxError)
    assert "ran" not in shell.user_ns


def test_unload_and_reload_extension(shell):
    shell.run_line_magic("unload_ext", "autograd_magic")
    result, _ = run(shell, "%%trackgraph\nran = True\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "ran" not in shell.user_ns
    shell.run_line_magic("load_ext", "autograd_magic")
    shell.run_line_magic("reload_ext", "autograd_magic")
    result, captured = run(shell, "%%trackgraph --text\nran = True\n")
    assert result.success and shell.user_ns["ran"] is True
    assert "autograd_magic trace (finished)" in captured.stdout
    # The transformer for cells with `await` is registered once and goes with the magic.
    assert shell.input_transformers_cleanup.count(await_cells) == 1
    shell.run_line_magic("unload_ext", "autograd_magic")
    assert await_cells not in shell.input_transformers_cleanup
    shell.run_line_magic("load_ext", "autograd_magic")


def test_a_bad_option_in_a_cell_with_await_is_a_usage_error_and_nothing_runs(shell):
    cell = "%%trackgraph --bogus\nimport asyncio\nran = True\nawait asyncio.sleep(0)\n"
    result, captured = run(shell, cell)
    assert isinstance(result.error_in_exec, UsageError)
    assert "unrecognized arguments: --bogus" in captured.stderr
    assert "usage: %%trackgraph" in captured.stderr
    assert "ran" not in shell.user_ns


def test_only_trackgraph_cells_with_top_level_await_are_rewritten(shell):
    plain = ["%%trackgraph -o t\n", "x = 1\n"]
    nested = ["%%trackgraph\n", "async def f():\n", "    await g()\n"]
    other = ["%%timeit\n", "await g()\n"]
    assert await_cells(plain) == plain and await_cells(nested) == nested
    assert await_cells(other) == other
    rewritten = await_cells(["%%trackgraph -o t\n", "await g()\n"])
    assert rewritten == [
        "await __import__('autograd_magic.magic').magic.run_cell_async('-o t', 'await g()\\n')\n"
    ]


class FakeComm(DummyComm):
    """Records every message a widget sends, with the time it was sent."""

    sent: list = []

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        FakeComm.sent.append((time.monotonic(), self.comm_id, msg_type, data))


LONG = """\
import time
start = time.monotonic()
x = torch.ones(8, requires_grad=True)
while time.monotonic() - start < 1.0:
    y = (x * 1.5).relu().sum()
cell_end = time.monotonic()
"""


@pytest.fixture
def widget_frontend(monkeypatch):
    FakeComm.sent = []
    monkeypatch.setattr(comm, "create_comm", FakeComm)
    monkeypatch.setattr(magic, "_widget_frontend", lambda shell: True)
    return FakeComm.sent


def test_live_updates_go_out_mid_cell_within_the_throttle(shell, panels, widget_frontend):
    refresh = 0.05
    result, captured = run(shell, f"%%trackgraph --refresh {refresh}\n" + LONG)
    assert result.success
    (panel,) = panels
    cell_end = shell.user_ns["cell_end"]
    updates = [
        (t, data["state"])
        for t, comm_id, kind, data in widget_frontend
        if kind == "comm_msg" and data["method"] == "update" and comm_id == panel.summary.model_id
    ]
    during = [(t, state) for t, state in updates if t < cell_end]
    # GIVEN a 1 s cell and a 0.05 s refresh THEN several summary updates left mid-cell ...
    assert len(during) >= 4
    assert any("Nodes created" in s["value"] for _, s in during)
    # ... each one state message per refresh, never closer together than the throttle.
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(during)]
    assert min(gaps) >= refresh - 0.01
    assert len(during) <= panel.live_renders + 1  # +1: the panel's first render, at creation
    assert len(during) <= 1.0 / refresh + 2
    # The display is shown once at the start and updated once at the end; then the static copy.
    first, last, static = captured.outputs
    assert "running" in first.data["text/html"]
    assert "application/vnd.jupyter.widget-view+json" in last.data
    assert "text/html" not in last.data  # one copy where widgets do not render
    assert "finished" in static.data["text/html"]


def test_live_panel_error_updates_the_same_display(shell, panels, widget_frontend):
    result, captured = run(shell, "%%trackgraph --refresh 0.01\n" + FAILING)
    assert isinstance(result.error_in_exec, RuntimeError)
    (panel,) = panels
    assert "Stopped by RuntimeError at line 4" in panel.status.value
    status_messages = [
        data["state"]["value"]
        for _, comm_id, kind, data in widget_frontend
        if kind == "comm_msg" and comm_id == panel.status.model_id
    ]
    assert "Stopped by RuntimeError at line 4" in status_messages[-1]
    assert captured.stdout.count("Traceback (most recent call last)") == 1


def test_no_live_renders_once_at_the_end(shell, panels, widget_frontend):
    result, captured = run(shell, "%%trackgraph --no-live\n" + RETAIN)
    assert result.success
    (panel,) = panels
    assert panel.live_renders == 0
    panel_view, static = captured.outputs
    assert "application/vnd.jupyter.widget-view+json" in panel_view.data
    assert "finished" in static.data["text/html"]


def test_syntax_error_shows_no_compiler_internals(shell):
    with capture_output() as captured:
        shell.run_cell("%%trackgraph\nran = True\ndef (:\n")
    shown = captured.stdout + captured.stderr
    assert "Cell In[" in shown and "SyntaxError: invalid syntax" in shown
    # IPython still lists its run_cell_magic frame and the magic's `raise`, as for any magic.
    assert "_compile_cell" not in shown and "compilerop" not in shown and "ast_parse" not in shown


def test_top_level_await_runs_like_a_plain_cell(shell):
    cell = (
        "%%trackgraph -o tr --text\nimport asyncio\nawait asyncio.sleep(0)\n"
        "x = torch.ones(2, requires_grad=True)\ny = x.exp()\nawait asyncio.sleep(0)\ny.sum()\n"
    )
    result, _ = run(shell, cell)
    assert result.error_in_exec is None
    assert float(result.result) == pytest.approx(2 * 2.718281828)
    assert shell.user_ns["tr"].nodes_created == 3  # exp, sum and x's AccumulateGrad


@pytest.mark.parametrize(
    "interactivity", ["all", "last", "last_expr", "last_expr_or_assign", "none"]
)
def test_the_values_shown_follow_ast_node_interactivity(shell, interactivity):
    """GIVEN IPython's ast_node_interactivity ('all' shows every expression statement's value,
    'last' those the last statement runs, 'last_expr_or_assign' also a last assignment's, 'none'
    none) WHEN a cell runs plain and under %%trackgraph THEN the same values are shown, in the
    same order."""

    def shown(cell: str) -> list[str]:
        with capture_output() as captured:
            shell.run_cell(cell, store_history=True)
        return [
            re.sub(r"Out\[\d+\]", "Out", line)
            for line in captured.stdout.splitlines()
            if line.startswith("Out[")
        ]

    cell = (
        "x = 3\nx + 1\nfor i in range(2):\n    i * 10\ny = x * 2\nfor j in range(2):\n    j + 7\n"
    )
    before = shell.ast_node_interactivity
    shell.ast_node_interactivity = interactivity
    try:
        plain = shown(cell)
        tracked = shown("%%trackgraph --text\n" + cell)
        plain_last = shown(cell + "x + 2")
        tracked_last = shown("%%trackgraph --text\n" + cell + "x + 2")
    finally:
        shell.ast_node_interactivity = before
    assert tracked == plain
    assert tracked_last == plain_last
    assert (
        plain_last
        == {
            "all": ["Out: 4", "Out: 0", "Out: 10", "Out: 7", "Out: 8", "Out: 5"],
            "last": ["Out: 5"],
            "last_expr": ["Out: 5"],
            "last_expr_or_assign": ["Out: 5"],
            "none": [],
        }[interactivity]
    )
