"""`%%trackgraph` in a real Jupyter kernel, whose event loop is running while cells run."""

from __future__ import annotations

import re
from typing import Any

import nbclient
import nbformat
import pytest
from test_examples import KERNEL, make_kernelspec

AWAIT_CELL = """%%trackgraph -o tr --text
import asyncio
x = torch.ones(2, requires_grad=True)
await asyncio.sleep(0)
y = x.exp()
await asyncio.sleep(0)
float(y.sum())
"""

FAILING_AWAIT_CELL = """%%trackgraph -o failed --no-live
await asyncio.sleep(0)
z = x.sin()
1 / 0
"""


def _run(cells: list[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setenv("JUPYTER_PATH", str(make_kernelspec(tmp_path / "spec")))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=120, allow_errors=True)
    client.execute()
    return nb.cells


def _without_colours(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _text(cell: Any) -> str:
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append("\n".join(out.traceback))
        elif "text/plain" in out.get("data", {}):
            parts.append(out.data["text/plain"])
    return "\n".join(parts)


def test_a_cell_with_top_level_await_runs_under_the_kernels_running_loop(tmp_path, monkeypatch):
    cells = _run(
        [
            "%load_ext autograd_magic\nimport asyncio, torch",
            AWAIT_CELL,
            "print(tr.nodes_created, type(tr).__name__)",
            FAILING_AWAIT_CELL,
            "print(failed.nodes_created, failed.error)",
            "%%trackgraph --no-live\nw = 1\n1 / 0\n",
        ],
        tmp_path,
        monkeypatch,
    )
    awaited, stored, _, after, failing_sync = (_text(c) for c in cells[1:])
    assert "Error" not in awaited, awaited
    assert "autograd nodes" in awaited  # the text report was printed
    assert "5.43656" in awaited  # the last expression's value is displayed
    assert stored.strip() == "3 Trace"  # exp, sum and x's AccumulateGrad
    # The cell's exception reaches the notebook once, unchanged, from the user's line.
    errors = [o for o in cells[3].outputs if o.output_type == "error"]
    assert [(e.ename, e.evalue) for e in errors] == [("ZeroDivisionError", "division by zero")]
    traceback = _without_colours("\n".join(errors[0].traceback))
    assert "Cell In[4], line 3\n      1 await asyncio.sleep(0)" in traceback  # its own number
    assert "----> 3 1 / 0" in traceback
    assert "_run_async" not in traceback and "_end" not in traceback
    assert after.split(" ", 1)[1].strip() == "ZeroDivisionError: division by zero"
    # A cell without `await` is numbered right too (IPython counts a cell before running it).
    assert "Cell In[6], line 2" in _without_colours(failing_sync)
