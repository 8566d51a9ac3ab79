"""The read pipeline end to end: a trace saved as JSON (format 4: facts, not sentences) and
loaded in a fresh process reports exactly what the live trace reported, quotes of a notebook
cell's code included (the cell's source is stored with the facts that cite it)."""

from __future__ import annotations

import linecache
import subprocess
import sys

import torch

import autograd_magic as am
from autograd_magic.views.text import render_text

CELL = "<ipython-input-7-0123abcd>"  # how IPython names a cell's code; no file on disk
CODE = """\
losses = []
for step in range(3):
    loss = (w * torch.ones(4)).sum()
    loss.backward()
    losses.append(loss)  # keeps every step's graph
"""


def run_cell() -> am.Trace:
    linecache.cache[CELL] = (len(CODE), None, CODE.splitlines(True), CELL)  # as IPython does
    namespace = {"torch": torch, "w": torch.ones(4, requires_grad=True)}
    with am.track(namespace=namespace) as trace:
        exec(compile(CODE, CELL, "exec"), namespace)
    return trace


def test_a_loaded_trace_reports_what_the_live_trace_reported(tmp_path):
    """GIVEN a cell keeping its losses, traced and saved THEN the file stores facts and the
    cell's source, and loaded in a fresh process its report is the live one, quote included."""
    trace = run_cell()
    live = render_text(trace.report(block="cell"))
    assert "`losses.append(loss)`" in live  # the finding quotes the cell's line
    path = tmp_path / "t.json"
    path.write_text(trace.to_json())
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from autograd_magic import Trace; "
            "from autograd_magic.views.text import render_text; "
            "t = Trace.from_json(open(sys.argv[1]).read()); "
            "print(render_text(t.report(block='cell')), end='')",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout == live


def test_the_json_stores_facts_not_sentences():
    """GIVEN the same trace THEN its export is format 4 with facts (kind and form, no message)
    and the source lines of the cell they cite; a reworded sentence would reach a saved trace."""
    import json

    document = json.loads(run_cell().to_json())
    assert document["version"] == 4 and "findings" not in document
    assert [f["kind"] for f in document["facts"]] == [f.kind for f in run_cell().facts]
    assert not any("message" in f for f in document["facts"])
    assert document["sources"][CELL][4] == "    losses.append(loss)  # keeps every step's graph"
