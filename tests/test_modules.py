"""Memory by module: each op's nn.Module, as the user would type its path, and per-module bytes."""

from __future__ import annotations

import json
import warnings
import weakref

import torch
import torch.nn as nn

import autograd_magic as am


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.inner(x).exp())


def by_path(trace: am.Trace) -> dict[str, am.ModuleStats]:
    return {m.path: m for m in trace.modules()}


def test_ops_are_attributed_to_the_module_path_the_user_would_type():
    """GIVEN a model with nested containers WHEN its forward runs tracked THEN every saved
    buffer and node made inside it names its module from the user's own variable."""
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(4, 8, requires_grad=True)
    with am.track() as trace:
        loss = model(x).sum()
    modules = {b.module for b in trace.buffers}
    assert {"model.inner.0", "model.inner.1", "model", "model.head"} <= modules
    tanh = next(n for n in trace.nodes if n.name == "TanhBackward0")
    assert tanh.module == "model.inner.1"
    total = next(n for n in trace.nodes if n.name == "SumBackward0")
    assert total.module is None  # `.sum()` ran outside any module
    del loss


def test_module_bytes_total_includes_submodules_and_self_excludes_them():
    """GIVEN the same model WHEN summarised by module THEN saved_bytes adds submodules,
    self_saved_bytes does not, parameters are not counted, and the root's total is every
    attributed buffer's bytes; entries come largest first."""
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(4, 8, requires_grad=True)
    with am.track() as trace:
        loss = model(x).sum()
    stats = by_path(trace)
    inner, tanh, root = stats["model.inner"], stats["model.inner.1"], stats["model"]
    assert tanh.self_saved_bytes == 4 * 8 * 4  # tanh saves its output: 4 x 8 float32
    assert inner.self_saved_bytes == 0 and inner.saved_bytes >= tanh.saved_bytes
    assert root.self_saved_bytes == 4 * 8 * 4  # exp in Block.forward saves its output
    attributed = sum(b.nbytes for b in trace.buffers if b.module and b.retained)
    assert root.saved_bytes == attributed
    assert root.type == "Block" and inner.type == "Sequential" and tanh.type == "Tanh"
    assert root.calls == 1 and root.nodes_created >= 6
    sizes = [m.saved_bytes for m in trace.modules()]
    assert sizes == sorted(sizes, reverse=True)
    del loss


def test_a_module_called_twice_counts_two_calls_and_both_outputs():
    """GIVEN one Linear applied twice WHEN tracked THEN it is one entry with 2 calls."""
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    with am.track() as trace:
        y = lin(lin(x).relu()).sum()
    entry = by_path(trace)["lin"]
    assert entry.calls == 2
    # AddmmBackward0 and TBackward0 per call, plus the AccumulateGrad nodes of weight, bias and
    # x, first reached from inside the module's first call.
    assert entry.nodes_created == 2 * 2 + 3
    del y


def test_released_buffers_leave_the_peak_and_a_json_round_trip_keeps_modules():
    """GIVEN a forward then backward WHEN summarised THEN the peak is what was alive before the
    backward, counting once the tensor that exp and head both saved, as the summary does; and a
    JSON round trip gives the same module table."""
    torch.manual_seed(0)
    model = Block()
    with am.track() as trace:
        model(torch.randn(4, 8)).sum().backward()
    root = by_path(trace)["model"]
    # The input (no variable holds it), tanh's output, and exp's output saved by exp and by
    # head: 4 x 128 B saved, 3 storages
    assert root.saved_bytes == 512
    assert root.peak_retained_bytes == trace.snapshot().peak_retained_bytes == 384
    loaded = am.Trace.from_json(trace.to_json())
    assert loaded.modules() == trace.modules()
    assert json.loads(trace.to_json())["version"] == 4


def test_modules_with_their_own_hooks_give_the_same_values_tracked():
    """GIVEN a module whose own hooks change its input and output WHEN run tracked THEN outputs
    and gradients are identical to untracked, and the hooks ran exactly as often."""
    calls = []

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(1)
        lin = nn.Linear(3, 3)
        lin.register_forward_pre_hook(lambda m, a: (calls.append("pre"), (a[0] * 2,))[1])
        lin.register_forward_hook(lambda m, a, out: (calls.append("post"), out + 1)[1])
        x = torch.randn(2, 3, requires_grad=True)
        out = lin(x)
        out.sum().backward()
        return out.detach(), x.grad

    plain = run()
    plain_calls = list(calls)
    calls.clear()
    with am.track():
        tracked = run()
    assert torch.equal(plain[0], tracked[0]) and torch.equal(plain[1], tracked[1])
    assert calls == plain_calls == ["pre", "post"]


def test_scripted_and_compiled_modules_run_the_same_and_hooks_are_removed():
    """GIVEN a TorchScript module and a torch.compile'd one WHEN called tracked THEN results
    equal untracked ones and no global module hook is left after the block."""
    torch.manual_seed(2)
    lin = nn.Linear(3, 3)
    scripted = torch.jit.script(nn.Sequential(nn.Linear(3, 3), nn.ReLU()))
    compiled = torch.compile(lin, backend="eager")
    x = torch.randn(2, 3)
    expected = (scripted(x), compiled(x))
    hooks_before = (
        len(torch.nn.modules.module._global_forward_pre_hooks),
        len(torch.nn.modules.module._global_forward_hooks),
    )
    with warnings.catch_warnings(record=True) as caught, am.track():
        warnings.simplefilter("always")
        got = (scripted(x), compiled(x))
    assert [str(w.message) for w in caught if "global hooks" in str(w.message)] == []
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert hooks_before == (
        len(torch.nn.modules.module._global_forward_pre_hooks),
        len(torch.nn.modules.module._global_forward_hooks),
    )


def test_a_transformer_encoder_names_its_layers():
    """GIVEN torch's own TransformerEncoder WHEN a step runs tracked THEN its layers are entries
    named as the user reaches them, and attention is among the largest."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    with am.track() as trace:
        encoder(torch.randn(2, 5, 32)).sum().backward()
    stats = by_path(trace)
    assert {"encoder.layers.0", "encoder.layers.1", "encoder.layers.0.self_attn"} <= set(stats)
    assert stats["encoder.layers.0"].type == "TransformerEncoderLayer"
    assert stats["encoder"].saved_bytes == sum(
        stats[f"encoder.layers.{i}"].saved_bytes for i in range(2)
    )


def test_the_text_report_and_panel_show_memory_by_module():
    """GIVEN a transformer step WHEN rendered THEN the summary names the repeated structure that
    saved most, the text report has the module tree, and the panel's Modules tab the same."""
    from autograd_magic.report.model import SectionId
    from autograd_magic.views.panel import TABS, TracePanel
    from autograd_magic.views.text import render_text

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    with am.track() as trace:
        encoder(torch.randn(2, 5, 32)).sum().backward()
    text = render_text(trace.report())
    assert "Most saved memory: encoder.layers.*.self_attn" in text
    # AND a pattern says it adds up its 2 layers, which the table lists one by one (issue 36)
    summary = text[text.index("Most saved memory:") :].splitlines()[0]
    assert "encoder.layers.*.self_attn" in summary
    assert summary.endswith("(each pattern adds up its 2 modules)"), summary  # said once
    tree = text[text.index("Memory by module:") :].splitlines()
    assert tree[2].split()[:2] == ["encoder", "TransformerEncoder"]
    assert "100%" in tree[2]
    assert any(line.split()[:2] == ["self_attn", "MultiheadAttention"] for line in tree)
    panel = TracePanel(trace)
    assert "encoder.layers.*.self_attn" in panel.summary.value
    modules = TABS.index(SectionId.MODULES)
    panel.tabs.selected_index = modules  # tables are built when their tab is first opened
    assert "MultiheadAttention" in panel.modules.value
    assert panel.tabs.titles[modules].startswith("Modules (")


def test_the_summary_merges_repeated_layers_but_not_a_sequentials_different_children():
    """GIVEN a Sequential of Linear, ReLU, Linear WHEN summarised THEN its children are named one
    by one (`model.1`), not merged into `model.*` as repeated layers would be."""
    from autograd_magic.analysis.result import analyze
    from autograd_magic.report.modules import top_modules

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    with am.track() as trace:
        loss = model(torch.randn(4, 8)).sum()  # both Linear layers save: inputs nobody holds
    names = [path for path, _ in top_modules(analyze(trace))]
    assert names and all("*" not in name for name in names)
    assert "model.1" in names  # ReLU saves its output
    del loss


def test_the_live_summary_names_no_module_until_the_block_ends():
    """GIVEN a model running inside a block WHEN the summary is read mid-block THEN it names no
    module (root names are only known at the end); once finished it names the user's variable."""
    from autograd_magic.analysis.result import analyze
    from autograd_magic.report.sentences import summary_items

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with am.track() as trace:
        out = model(torch.randn(2, 4)).sum()
        live = dict(summary_items(analyze(trace)))
    assert "Most saved memory" not in live
    assert dict(summary_items(analyze(trace)))["Most saved memory"].startswith("model.")
    del out


def test_a_transformers_tables_name_modules_and_deep_parameters():
    """GIVEN a 2-layer nn.TransformerEncoder trained one Adam step WHEN its report is built
    THEN saved tensors name their module (repeated layers on one row) and the optimizer's
    writes name parameters five levels deep, as the user would type them."""
    from autograd_magic.analysis.result import analyze
    from autograd_magic.report.buffers import buffer_table
    from autograd_magic.report.versions import versions_table

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(2, 5, 16)
    with am.track() as trace:
        model(x).sum().backward()
        opt.step()
    table = buffer_table(analyze(trace))
    assert table.headers[:3] == ("node", "module", "tensor")
    modules = {row[1] for row in table.rows}
    assert "model.layers.*.self_attn" in modules
    assert "model.layers.*.linear1" in modules
    labels = {v.label for v in trace.version_bumps}
    assert "model.layers.1.self_attn.in_proj_weight" in labels
    assert "opt.state[model.layers.0.self_attn.out_proj.weight]['exp_avg']" in labels
    rows = {row[0]: row[3] for row in versions_table(analyze(trace)).rows if row[1] == "addcdiv_"}
    # (two layers are too few to merge: each keeps its own row)
    assert rows["model.layers.0.self_attn.in_proj_weight"] == "0 -> 1"
    assert rows["model.layers.1.self_attn.in_proj_weight"] == "0 -> 1"


def test_the_module_table_shows_identical_repeated_layers_once():
    """GIVEN a 4-layer encoder behind an input projection (so every layer gets an activation,
    and all four save alike) WHEN its module table is built THEN layer 0 is expanded and layers
    1-3 are one row saying they are alike."""
    from autograd_magic.analysis.result import analyze
    from autograd_magic.report.modules import module_table

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    model = nn.Sequential(nn.Linear(16, 16), encoder)
    with am.track() as trace:
        out = model(torch.randn(2, 5, 16))
    rows = [(row[0].strip(), row[1]) for row in module_table(analyze(trace)).rows]
    assert ("0", "TransformerEncoderLayer") in rows
    assert ("self_attn", "MultiheadAttention") in rows
    assert ("1-3", "TransformerEncoderLayer x3 (each as 0)") in rows
    assert sum(name == "self_attn" for name, _ in rows) == 1
    # every module is still in trace.modules(): 4 outer ones and 9 in each layer
    assert len(trace.modules()) == 4 + 4 * 9
    del out


def test_an_interrupt_while_module_hooks_are_installed_leaves_none_behind(monkeypatch):
    """GIVEN a KeyboardInterrupt right after the block's forward hook was registered (before
    it was marked always-called) WHEN the block is entered THEN the interrupt reaches the user
    and no global module hook of ours is left registered."""
    from torch.nn.modules import module as nn_module

    before = (
        dict(nn_module._global_forward_pre_hooks),
        dict(nn_module._global_forward_hooks),
    )

    class Interrupting(dict):
        def __setitem__(self, key, value):
            raise KeyboardInterrupt

    monkeypatch.setattr(nn_module, "_global_forward_hooks_always_called", Interrupting())
    raised = False
    try:
        with am.track():
            pass
    except KeyboardInterrupt:
        raised = True
    assert raised
    assert dict(nn_module._global_forward_pre_hooks) == before[0]
    assert dict(nn_module._global_forward_hooks) == before[1]
    from autograd_magic.recorder.torch_api import original_has_any_global_hook

    # (torch's own "any global hook?" check is put back once no tracker is installed)
    assert getattr(nn_module, "_has_any_global_hook", None) is original_has_any_global_hook


def test_module_calls_on_other_threads_are_not_this_blocks():
    """GIVEN another thread calling its own model while a block runs WHEN the block ends THEN
    the block's modules are its own thread's only (the global hooks see every thread)."""
    import threading

    torch.manual_seed(0)
    model, other = Block(), nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    x = torch.randn(4, 8, requires_grad=True)
    results = []
    worker = threading.Thread(target=lambda: results.append(other(x).sum().item()))
    with am.track() as trace:
        worker.start()
        worker.join()
        loss = model(x).sum()
    assert results  # the other thread's model ran, during the block
    assert set(trace.module_calls) == {
        "model",
        "model.inner",
        "model.inner.0",
        "model.inner.1",
        "model.head",
    }
    assert {n.module for n in trace.nodes} <= {None, *trace.module_calls}
    del loss


def test_numpy_and_hooks_on_other_threads_are_not_this_blocks():
    """GIVEN another thread calling torch.from_numpy and entering its own saved-tensor hooks
    while a block runs THEN the block records neither (both are patched globally)."""
    import threading

    import numpy as np

    def elsewhere() -> None:
        torch.from_numpy(np.ones(3))
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            pass

    with am.track() as trace:
        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()
        mine = torch.from_numpy(np.zeros(2))
    assert [link.how for link in trace.links] == ["from_numpy"]
    assert not trace.blindspots
    del mine


def test_an_unnamed_module_made_in_every_step_is_one_row_by_its_class():
    """GIVEN a loss module created inside each step (as Hugging Face models do) WHEN three steps
    run tracked THEN its calls are one row named by its class, not a placeholder per step."""
    model = nn.Linear(4, 1)
    x, y = torch.randn(3, 4), torch.randn(3, 1)
    with am.track() as trace:
        for _ in range(3):
            nn.MSELoss()(model(x), y).backward()
    assert trace.module_calls == {"model": 3, "MSELoss": 3}
    assert {m.path for m in trace.modules()} == {"model", "MSELoss"}


def test_modules_made_in_every_step_are_not_kept_and_not_scanned(gc_disabled):
    """GIVEN a loss module created inside each of 500 steps (as Hugging Face models do) WHEN the
    steps run tracked THEN each loss dies when its step drops it, and the module tracker holds a
    bounded number of roots, not one per step (each call's lookup scanned them all: a step
    slowed down as the loop went on)."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3))
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    recorder = am.track()
    held = []
    with recorder as trace:
        for _ in range(500):
            loss_fn = nn.CrossEntropyLoss()
            loss_fn(model(x), y).backward()
            dead = weakref.ref(loss_fn)
            del loss_fn
            assert dead() is None  # never kept alive by the tracker
            held.append(len(recorder.modules._roots))
    assert max(held[250:]) <= max(held[:250]), held[-1]  # no more late in the loop than early
    assert trace.module_calls == {
        "model": 500,
        "model.0": 500,
        "model.1": 500,
        "model.2": 500,
        "CrossEntropyLoss": 500,
    }


def test_the_module_table_says_what_each_column_counts():
    # GIVEN a module called in a 5-step loop
    from autograd_magic.analysis.result import analyze
    from autograd_magic.report.modules import module_table

    model = torch.nn.Linear(4, 4)
    with am.track() as trace:
        for _ in range(5):
            model(torch.ones(2, 4)).sum().backward()
    table = module_table(analyze(trace))
    # THEN the saved column names itself a sum over calls, the peak a moment (issue 36, item 2)
    saved, peak = table.headers.index("saved, all calls"), table.headers.index("peak held at once")
    (row,) = table.rows
    assert row[table.headers.index("calls")] == "5"
    assert row[saved] != row[peak]
    assert "add up every call" in table.note
    # AND it says what it leaves out that the Buffers tab lists (`model.0` saved 0 B beside the
    # Buffers tab's 2 KiB per call of "your tensor")
    assert "not parameters, nor tensors your code still holds" in table.note
