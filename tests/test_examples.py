"""Every example notebook runs top to bottom under the README's `jupyter nbconvert --to notebook
--execute` with default options (a fresh kernel, no --allow-errors), and its key cells produce the
findings its prose promises: asserted on the stored traces (`%%trackgraph -o NAME`), not only on
"no error". The committed notebooks are checked too: executed, with the static fallback, small.

Regenerate the committed outputs after changing a notebook or the panel:
`python tests/test_examples.py` (all) or `python tests/test_examples.py 03_two_heads`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
KERNEL = "autograd-magic-examples"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
MAX_NOTEBOOK_BYTES = 1024 * 1024
MARK = "@@autograd_magic traces@@"

# Appended to each notebook under test: every Trace in the kernel's namespace, as JSON.
DUMP_CELL = f"""
import dataclasses as _dataclasses
import json as _json
import autograd_magic as _am

def _dump(trace):
    return {{
        "error": trace.error,
        "findings": [
            {{"kind": f.kind, "line": f.line, "related": list(f.related_lines),
              "holder": f.holder, "nbytes": f.nbytes, "message": f.message}}
            for f in trace.findings
        ],
        "snapshot": _dataclasses.asdict(trace.snapshot()),
        "backward_calls": [
            {{"line": c.line, "retain_graph": c.retain_graph, "error": c.error}}
            for c in trace.backward_calls
        ],
        "storage": [
            {{"members": list(g.members), "how": g.how, "copies": g.copies}}
            for g in trace.storage_groups()
        ],
        "nodes_freed_at": sorted({{n.freed_line for n in trace.nodes if not n.alive}}),
        "buffers_released_at": sorted({{b.freed_line for b in trace.buffers if b.freed}}),
        "modules": [
            {{"path": m.path, "saved": m.saved_bytes, "peak": m.peak_retained_bytes}}
            for m in trace.modules()
        ],
    }}

print({MARK!r} + _json.dumps(
    {{k: _dump(v) for k, v in list(globals().items()) if isinstance(v, _am.Trace)}}
))
"""


# ----- helpers ---------------------------------------------------------------------------
def notebook_names() -> list[str]:
    return sorted(p.stem for p in EXAMPLES.glob("*.ipynb"))


def read(name: str) -> Any:
    return nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)


def magic_cells(nb: Any) -> dict[str, Any]:
    """`%%trackgraph -o NAME` cells by NAME."""
    cells = {}
    for cell in nb.cells:
        first = cell.source.split("\n", 1)[0].split() if cell.cell_type == "code" else []
        if first[:1] == ["%%trackgraph"] and "-o" in first:
            cells[first[first.index("-o") + 1]] = cell
    return cells


def body_line(nb: Any, name: str, text: str) -> int:
    """The cell-body line (1 = first line after %%trackgraph) of the only line holding `text`."""
    body = magic_cells(nb)[name].source.split("\n")[1:]
    hits = [i + 1 for i, line in enumerate(body) if text in line]
    assert len(hits) == 1, f"{text!r} is on lines {hits} of the {name!r} cell"
    return hits[0]


def raises_tagged(cell: Any) -> bool:
    return "raises-exception" in cell.get("metadata", {}).get("tags", [])


def make_kernelspec(where: Path, name: str = KERNEL) -> Path:
    """A kernelspec running this interpreter, so the notebooks use the package under test
    (named "python3", it is the one the notebooks' own metadata asks for)."""
    spec = where / "kernels" / name
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": name, "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel), encoding="utf-8")
    return where


def execute(nb: Any, store_widget_state: bool = False) -> Any:
    """Run `nb` in a fresh kernel from the examples folder; cells tagged raises-exception may
    raise, any other error fails."""
    client = nbclient.NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=120,
        record_timing=False,
        store_widget_state=store_widget_state,
        resources={"metadata": {"path": str(EXAMPLES)}},
    )
    client.execute()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    return nb


class Run:
    """One fresh execution of a notebook: its cells (with outputs) and its traces."""

    def __init__(self, name: str, nb: Any, traces: dict[str, Any], seconds: float) -> None:
        self.name, self.nb, self.traces, self.seconds = name, nb, traces, seconds

    def kinds(self, trace: str) -> list[str]:
        return [f["kind"] for f in self.traces[trace]["findings"]]

    def only(self, trace: str, kind: str) -> dict[str, Any]:
        found = [f for f in self.traces[trace]["findings"] if f["kind"] == kind]
        assert len(found) == 1, (trace, self.traces[trace]["findings"])
        return found[0]

    def line(self, trace: str, text: str) -> int:
        return body_line(self.nb, trace, text)

    def panel(self, trace: str) -> dict[str, str]:
        """The headline numbers the panel showed when the cell ended (its text fallback)."""
        return panel_numbers(magic_cells(self.nb)[trace])


def panel_numbers(cell: Any) -> dict[str, str]:
    shown = [o for o in cell.outputs if o.output_type == "display_data"]
    assert shown, "no panel output"
    summary = shown[-1]["data"]["text/plain"].split("\n\n")[1]
    return dict(line.strip().split(": ", 1) for line in summary.splitlines())


@pytest.fixture(scope="module")
def python3_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_kernelspec(tmp_path_factory.mktemp("python3-kernelspec"), "python3"))


def nbconvert_env(jupyter_path: str, home: Path) -> dict[str, str]:
    """The environment of a user's `jupyter nbconvert`: this package first on the path, a
    "python3" kernel running this interpreter, no IPython startup files of the machine's."""
    env = dict(os.environ, JUPYTER_PATH=jupyter_path, PYTHONPATH=str(ROOT))
    env["IPYTHONDIR"] = str(home / "ipython")
    return env


@pytest.fixture
def run_notebook(python3_path: str, tmp_path: Path):
    """Each example as the README runs it, `jupyter nbconvert --to notebook --execute` with
    default options (no --allow-errors, no timeout, the kernel the notebook names); the examples
    read no files, so a copy runs anywhere."""

    def run(name: str) -> Run:
        nb = read(name)
        nb.cells.append(nbformat.v4.new_code_cell(DUMP_CELL))
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
        command = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute"]
        start = time.perf_counter()
        done = subprocess.run(
            [*command, f"{name}.ipynb"],
            cwd=tmp_path,
            env=nbconvert_env(python3_path, tmp_path),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        seconds = time.perf_counter() - start
        assert done.returncode == 0, f"nbconvert stopped in {name}:\n{done.stderr[-3000:]}"
        nb = nbformat.read(tmp_path / f"{name}.nbconvert.ipynb", as_version=4)
        dumped = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
        assert MARK in dumped, nb.cells[-1].outputs
        traces = json.loads(dumped.split(MARK, 1)[1])
        print(f"{name}: executed in {seconds:.1f} s")
        return Run(name, nb, traces, seconds)

    return run


# ----- every notebook ----------------------------------------------------------------------
EXPECTED_NOTEBOOKS = [
    "01_per_sample_forward",
    "02_backward_twice",
    "03_two_heads",
    "04_inplace_relu",
    "05_copies",
    "06_growing_graph",
    "07_what_keeps_graphs_alive",
    "08_real_models",
    "quickstart",
]


def test_examples_folder_holds_the_quickstart_and_one_notebook_per_question():
    # GIVEN the examples folder WHEN listed THEN it holds exactly the notebooks checked below
    assert notebook_names() == EXPECTED_NOTEBOOKS


def test_the_quickstart_links_every_other_notebook():
    # GIVEN the quickstart's markdown WHEN read THEN it links each example notebook (issue 36)
    text = "".join(c.source for c in read("quickstart").cells if c.cell_type == "markdown")
    linked = {name for name in EXPECTED_NOTEBOOKS if f"({name}.ipynb)" in text}
    assert linked == set(EXPECTED_NOTEBOOKS) - {"quickstart"}


@pytest.mark.parametrize("name", EXPECTED_NOTEBOOKS)
def test_committed_notebook_is_executed_small_and_carries_the_static_fallback(name):
    # GIVEN the committed notebook
    path = EXAMPLES / f"{name}.ipynb"
    nb = read(name)
    code = [c for c in nb.cells if c.cell_type == "code"]
    # THEN it starts by loading the extension, uses -o cells, and explains them in markdown
    assert code[0].source.startswith("%load_ext autograd_magic")
    assert magic_cells(nb), "no %%trackgraph -o NAME cell"
    assert nb.cells[0].cell_type == "markdown"
    # AND every code cell was executed, in order, by one kernel
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), counts
    # AND each panel cell carries the widget view, and last the static HTML and text report
    for trace, cell in magic_cells(nb).items():
        shown = [o for o in cell.outputs if o.output_type == "display_data"]
        assert shown, f"{trace}: no panel output"
        assert any(WIDGET_VIEW in o["data"] for o in shown), trace
        data = shown[-1]["data"]
        assert {"text/html", "text/plain"} <= set(data), (trace, set(data))
        assert data["text/plain"].startswith("autograd_magic trace")
        # AND a cell has an error output exactly when it is tagged raises-exception
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert bool(errors) == raises_tagged(cell), trace
    # AND the file stays review-sized
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES, f"{path.stat().st_size:,} bytes"


def _committed_sentences(nb: Any) -> dict[str, str]:
    out = {}
    for trace, cell in magic_cells(nb).items():
        shown = [o for o in cell.outputs if o.output_type == "display_data"]
        out[trace] = shown[-1]["data"]["text/plain"] if shown else ""
    return out


# ----- quickstart --------------------------------------------------------------------------
def test_quickstart_reports_the_running_total_and_the_fix_is_clean(run_notebook):
    # GIVEN the quickstart WHEN executed
    run = run_notebook("quickstart")
    # THEN the leaky loop names `total_loss` at the `+=` line and keeps every node alive
    leak = run.only("leaky", "kept-alive")
    assert leak["holder"] == "total_loss"
    assert leak["line"] == run.line("leaky", "total_loss += loss")
    assert run.kinds("leaky") == ["kept-alive"]
    created = run.traces["leaky"]["snapshot"]["nodes_created"]
    assert run.panel("leaky")["Live autograd nodes"] == f"{created} now / {created} peak"
    assert run.panel("leaky")["Backward calls"] == "3"
    # AND the .item() version has no findings
    assert run.kinds("fixed") == []
    assert_committed_outputs_match(run)


# ----- 1: per-sample forward -----------------------------------------------------------------
def test_per_sample_graphs_are_freed_at_the_next_forward_and_at_the_reset(run_notebook):
    run = run_notebook("01_per_sample_forward")
    trace = run.traces["per_sample"]
    forward = run.line("per_sample", "out = model(")
    # THEN the skipped samples' graphs are unused, and freed at the forward line (rebinding out)
    unused = run.only("per_sample", "unused-graph")
    assert unused["line"] == forward
    assert f"most at line {forward}" in unused["message"]
    assert run.kinds("per_sample") == ["unused-graph"]
    # AND the kept samples' saved tensors go at backward, their nodes at `total_loss = 0`
    backward = run.line("per_sample", ".backward()")
    reset = _reset_line(run)
    assert backward in trace["buffers_released_at"]
    assert {forward, reset} <= set(trace["nodes_freed_at"])
    # AND the batched, masked version builds one graph and uses all of it
    assert run.kinds("batched") == []
    assert len(run.traces["batched"]["backward_calls"]) == 1
    assert_committed_outputs_match(run)


def _reset_line(run: Run) -> int:
    body = magic_cells(run.nb)["per_sample"].source.split("\n")[1:]
    hits = [i + 1 for i, line in enumerate(body) if line.strip() == "total_loss = 0"]
    assert len(hits) == 2, hits  # before the loop and after each backward
    return hits[-1]


# ----- 2: backward twice ---------------------------------------------------------------------
def test_backward_twice_explains_the_error_and_what_retain_graph_keeps(run_notebook):
    run = run_notebook("02_backward_twice")
    # THEN the second backward's error names the first backward and where the tensors were saved
    freed = run.only("twice", "backward-through-freed")
    assert freed["holder"] == "e"
    assert freed["line"] == run.line("twice", "e.backward()")
    assert run.line("twice", "d.backward()") in freed["related"]
    assert run.line("twice", "exp()") in freed["related"]
    assert "backward through the graph a second time" in run.traces["twice"]["error"]
    # AND once `c` is deleted, the last retain_graph=True keeps exp's saved output, reported with
    # its bytes (the first one was needed: the second backward walks the same graph)
    kept = [f for f in run.traces["retained"]["findings"] if f["kind"] == "retained-graph"]
    assert {f["holder"] for f in kept} == {"e"}
    assert all(f["nbytes"] == 256 * 256 * 4 for f in kept)
    assert run.panel("retained")["Retained saved tensors"] == "256.0 KiB now / 256.0 KiB peak"
    # AND one backward over the sum is clean and ends holding nothing
    assert run.kinds("summed") == []
    assert run.panel("summed")["Retained saved tensors"].startswith("0 B now")
    assert_committed_outputs_match(run)


# ----- 3: two heads ---------------------------------------------------------------------------
def test_two_heads_name_the_shared_trunk_and_the_retained_head(run_notebook):
    run = run_notebook("03_two_heads")
    # THEN the second head's backward fails through the trunk the first one freed
    freed = run.only("sequential", "backward-through-freed")
    assert freed["holder"] == "car_loss"
    assert run.line("sequential", "features = trunk(") in freed["related"]
    assert run.line("sequential", "cat_loss.backward()") in freed["related"]
    # AND retaining the first graph leaves the cat head's saved tensors held by cat_loss
    kept = run.only("retain_first", "retained-graph")
    assert kept["holder"] == "cat_loss"
    assert kept["line"] == run.line("retain_first", "cat_loss.backward(")
    assert run.line("retain_first", "cat_loss = ") in kept["related"]
    assert run.kinds("retain_first") == ["retained-graph"]
    # AND summing the losses is clean
    assert run.kinds("summed") == []
    assert run.panel("summed")["Retained saved tensors"].startswith("0 B now")
    assert_committed_outputs_match(run)


# ----- 4: in-place ReLU ---------------------------------------------------------------------
def test_inplace_relu_saves_no_autograd_memory_and_breaks_a_saved_output(run_notebook):
    run = run_notebook("04_inplace_relu")
    out_of_place, in_place = run.traces["out_of_place"], run.traces["in_place"]
    # THEN both versions are clean and keep the same saved bytes at their peak
    assert run.kinds("out_of_place") == run.kinds("in_place") == []
    peak = out_of_place["snapshot"]["peak_retained_bytes"]
    assert peak == in_place["snapshot"]["peak_retained_bytes"] == 256 * 512 * 4
    # AND relu_ on sigmoid's saved output is flagged at the write, before backward fails
    hit = run.only("broken", "inplace-on-saved")
    assert hit["line"] == run.line("broken", "y.relu_()")
    assert run.line("broken", "torch.sigmoid(") in hit["related"]
    assert "SigmoidBackward0" in hit["message"] and "`y`" in hit["message"]
    assert "modified by an inplace operation" in run.traces["broken"]["error"]
    assert_committed_outputs_match(run)


# ----- 5: copies ----------------------------------------------------------------------------
def test_copies_show_shared_memory_silent_writes_and_clean_clones(run_notebook):
    run = run_notebook("05_copies")
    # THEN from_numpy, view, slice and numpy() are one storage group, and the write is shared
    (group,) = run.traces["shallow"]["storage"]
    assert set(group["members"]) == {"arr", "t", "v", "s", "back"}
    assert group["how"]["t"] == "from_numpy" and group["how"]["back"] == "numpy"
    shared = run.only("shallow", "shared-write")
    assert shared["line"] == run.line("shallow", "t.add_(1)")
    assert "`arr`" in shared["message"]
    # AND writing to a detached tensor hits exp's saved output and shares memory with it
    hit = run.only("detached", "inplace-on-saved")
    assert hit["line"] == run.line("detached", "d.add_(1)")
    assert "`y`" in run.only("detached", "shared-write")["message"]
    assert any(g["how"].get("d") == "detach" for g in run.traces["detached"]["storage"])
    # AND a .data write is reported as a silent bypass
    bypass = run.only("silent", "data-bypass")
    assert bypass["line"] == run.line("silent", "z.data.mul_(2)")
    assert run.line("silent", "w.exp()") in bypass["related"]
    assert run.kinds("silent") == ["data-bypass"]
    # AND clones are clean
    assert run.kinds("deep") == []
    assert_committed_outputs_match(run)


# ----- 6: growing graph ---------------------------------------------------------------------
def test_rnn_hidden_state_grows_with_retain_graph_and_detach_is_clean(run_notebook):
    run = run_notebook("06_growing_graph")
    carry = run.line("carried", "h = rnn(")
    # THEN the undetached state fails on the second backward, blaming the carried value
    freed = run.only("carried", "backward-through-freed")
    assert carry in freed["related"] and "h = h.detach()" in freed["message"]
    # AND the retain_graph "fix" grows the graph through `h` and keeps saved tensors
    growth = run.only("retained", "graph-growth")
    assert growth["holder"] == "h"
    assert growth["line"] == run.line("retained", "h = rnn(")
    assert run.line("retained", "retain_graph=True") in growth["related"]
    assert run.only("retained", "retained-graph")["nbytes"] > 0
    calls = run.traces["retained"]["backward_calls"]
    assert len(calls) == 6 and all(c["retain_graph"] for c in calls)
    # AND detaching once per chunk is clean
    assert run.kinds("detached") == []
    assert_committed_outputs_match(run)


# ----- 7: what keeps graphs alive -------------------------------------------------------------
def test_total_loss_list_and_attribute_each_keep_graphs_and_item_is_clean(run_notebook):
    run = run_notebook("07_what_keeps_graphs_alive")
    # THEN each holder is named: the running total, the list, the module attribute
    total = run.only("running_total", "kept-alive")
    assert total["holder"] == "total_loss"
    assert total["line"] == run.line("running_total", "total_loss += loss")
    assert "3 iterations" in total["message"]
    listed = run.only("loss_list", "kept-alive")
    assert listed["holder"] == "losses"
    # (reported where the reference is taken, with the line that computed it beside it)
    assert listed["line"] == run.line("loss_list", "losses.append(loss)")
    assert run.line("loss_list", "loss = F.mse_loss(") in listed["related"]
    assert "3 tensors" in listed["message"]
    for name in ("running_total", "loss_list"):
        assert run.kinds(name) == ["kept-alive"], name
    # AND a module attribute holding a validation loss that never reached a backward is named,
    # with the forward line that stored it (holding the last, backpropagated loss is normal).
    attribute = run.only("self_loss", "kept-alive")
    assert attribute["holder"] == "criterion.loss"
    assert attribute["line"] == run.line("self_loss", "criterion(model(data[64:])")
    assert "self.loss = F.mse_loss(out, target)" in attribute["message"]
    # (one finding: the attribute's graph is the validation pass's, which no backward used)
    assert run.kinds("self_loss") == ["kept-alive"]
    # AND keeping numbers is clean
    assert run.kinds("fixed") == []
    assert_committed_outputs_match(run)


# ----- 8: real models -------------------------------------------------------------------------
def test_real_models_name_the_layers_that_save_and_the_list_that_holds(run_notebook):
    run = run_notebook("08_real_models")
    # THEN the transformer step's saved memory is attributed to its layers, attention first
    modules = {m["path"]: m for m in run.traces["train_step"]["modules"]}
    assert run.traces["train_step"]["modules"][0]["path"] == "model"
    layers = [modules[f"model.encoder.layers.{i}"]["saved"] for i in range(4)]
    assert len(set(layers)) == 1 and layers[0] > 0
    attention = modules["model.encoder.layers.0.self_attn"]["saved"]
    children = [m["saved"] for path, m in modules.items() if path.count(".") == 4]
    assert attention == max(children) > 0
    assert run.kinds("train_step") == []
    assert run.panel("train_step")["Most saved memory"].startswith(
        "model.encoder.layers.*.self_attn"
    )
    # AND the 1,000-step loop's validation outputs are named as what holds the graphs, first
    assert run.kinds("kept")[0] == "kept-alive"
    kept = run.only("kept", "kept-alive")
    assert kept["holder"] == "val_outputs"
    assert kept["line"] == run.line("kept", "val_outputs.append(net(val_data))")
    held = {m["path"]: m["peak"] for m in run.traces["kept"]["modules"]}
    assert held["net"] == run.traces["kept"]["snapshot"]["retained_bytes"] > 1_000_000
    assert run.panel("kept")["Backward calls"] == "1,000"
    # AND that is the one finding: the optimizer's writes to weights those graphs saved break no
    # backward, since nobody backpropagates through them
    assert run.kinds("kept") == ["kept-alive"]
    # AND validating under no_grad is clean
    assert run.kinds("fixed") == []
    assert run.traces["fixed"]["snapshot"]["retained_bytes"] == 0
    assert_committed_outputs_match(run)


def assert_committed_outputs_match(run: Run) -> None:
    """The committed panels say what a fresh run says: each finding, in the same words."""
    committed = _committed_sentences(read(run.name))
    assert set(committed) <= set(run.traces), "a committed panel has no trace in a fresh run"
    for trace, text in committed.items():
        for finding in run.traces[trace]["findings"]:
            assert finding["message"] in text, (
                f"{run.name}.ipynb is stale ({trace}): re-run `python tests/test_examples.py "
                f"{run.name}`"
            )


# ----- saved notebooks anywhere ---------------------------------------------------------------
def test_nbconvert_default_html_shows_findings_numbers_and_pictures(python3_path, tmp_path):
    """`jupyter nbconvert --to html --execute` with default options stores widget state, so it
    renders each widget view as a placeholder needing a CDN: the static copy must be there too."""
    # GIVEN the quickstart WHEN converted with nbconvert's defaults (the README's command)
    source = tmp_path / "quickstart.ipynb"
    source.write_text((EXAMPLES / "quickstart.ipynb").read_text(encoding="utf-8"), "utf-8")
    command = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--execute"]
    env = nbconvert_env(python3_path, tmp_path)
    subprocess.run([*command, str(source)], env=env, check=True, capture_output=True, timeout=120)
    page = (tmp_path / "quickstart.html").read_text(encoding="utf-8")
    # THEN widget state was stored (the case that used to show only placeholders) ...
    assert "application/vnd.jupyter.widget-state+json" in page
    # ... and the page still has each panel's findings, numbers and pictures, offline
    cells = len(magic_cells(read("quickstart")))
    assert page.count("autograd-magic-static") >= cells
    assert "total_loss" in page and "Findings" in page
    assert "Live autograd nodes" in page
    assert page.count("data:image/png;base64,") >= 2 * cells


# ----- regenerating the committed notebooks ----------------------------------------------------
def regenerate(names: list[str]) -> None:
    """Execute the named notebooks in place (outputs small: no stored widget state)."""
    os.environ["JUPYTER_PATH"] = str(make_kernelspec(Path(tempfile.mkdtemp())))
    for name in names:
        start = time.perf_counter()
        nb = execute(read(name))
        nbformat.write(nb, EXAMPLES / f"{name}.ipynb")
        size = (EXAMPLES / f"{name}.ipynb").stat().st_size
        print(f"{name}: {time.perf_counter() - start:.1f} s, {size / 1024:.0f} KiB")


if __name__ == "__main__":
    regenerate(sys.argv[1:] or notebook_names())
