"""Watch mode (issue 34): every step counted cheaply, some captured in full, escalation when
graphs pile up, an out-of-memory post-mortem, and the promise kept in every mode."""

from __future__ import annotations

import contextlib
import gc
import json
import warnings
import weakref

import pytest
import torch

import autograd_magic as am
from autograd_magic.views.text import render_watch_text
from autograd_magic.watch_trace import WatchTrace


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, torch.randn(4, 8), torch.randn(4, 1)


def correct_loop(steps: int, **options):
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with am.watch(**options) as w:
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
    return w.result, model


def leaking_loop(steps: int, **options):
    model, x, y = model_and_data()
    losses = []
    with am.watch(**options) as w:
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            losses.append(loss)  # keeps every step's graph
    return w.result


def test_a_correct_loop_is_counted_and_never_escalates():
    """GIVEN a correct 30-step loop WHEN watched THEN 30 steps are counted, only the first is
    captured, the counters stay flat and nothing is found."""
    result, _ = correct_loop(30)
    assert isinstance(result, WatchTrace)
    assert [s.step for s in result.steps] == list(range(1, 31))
    assert [s.captured for s in result.steps] == [True] + [False] * 29
    assert len(result.windows) == 1 and result.windows[0].reason == "the first steps"
    assert {s.live_roots for s in result.steps[1:]} == {1}
    assert {s.retained_bytes for s in result.steps[1:]} == {0}
    assert result.findings == []


def test_a_loop_keeping_its_losses_escalates_within_a_few_steps_and_names_the_holder():
    """GIVEN a loop that appends each loss (graph and all) to a list WHEN watched THEN live
    backward roots rise every step, the watch captures the next steps in full, and the findings
    of that window name `losses`."""
    result = leaking_loop(20, first=0)
    roots = [s.live_roots for s in result.steps]
    assert roots[:5] == [1, 2, 3, 4, 5]
    (window,) = result.windows
    assert window.reason == "live backward roots grew from step 2"
    assert window.first_step <= 10 and window.last_step == window.first_step + 2
    assert any(f.holder == "losses" for f in result.findings), result.findings
    text = render_watch_text(result.report())
    assert "captured: live backward roots grew from step 2" in text


def gan_loop(iterations: int, keep: bool, **options):
    """DCGAN's three backward calls an iteration (pytorch/examples dcgan/main.py, shrunk):
    `errD = errD_real + errD_fake` keeps the last iteration's two D losses until it is
    reassigned; with `keep`, a history keeps every errD as well (the leak)."""
    torch.manual_seed(0)
    net_d, net_g = torch.nn.Linear(4, 1), torch.nn.Linear(2, 4)
    real, history = torch.randn(8, 4), []
    with am.watch(**options) as w:
        for _ in range(iterations):
            errD_real = net_d(real).sigmoid().mean()
            errD_real.backward()
            fake = net_g(torch.randn(8, 2))
            errD_fake = net_d(fake.detach()).sigmoid().mean()
            errD_fake.backward()
            errD = errD_real + errD_fake
            errG = -net_d(fake).sigmoid().mean()
            errG.backward()
            if keep:
                history.append(errD)
    return w.result


def test_a_gan_loop_is_read_across_its_iterations():
    """GIVEN DCGAN's loop (three backward calls an iteration, live roots ending its steps 1, 2,
    3, 4, 5, 3, 4, 5, ...) WHEN watched THEN no window opens: growth is read from one
    iteration to the next, not within one; and the same loop keeping every errD escalates within
    four iterations."""
    correct = gan_loop(12, keep=False, first=0)
    assert [s.live_roots for s in correct.steps[:9]] == [1, 2, 3, 4, 5, 3, 4, 5, 3]
    assert correct.windows == []
    leak = gan_loop(12, keep=True, first=0)
    assert len(leak.windows) == 1
    assert leak.windows[0].first_step <= 12
    assert "live backward roots grew" in leak.windows[0].reason


def train_then_evaluate(keep: bool, watched: bool = True, first: int = 0):
    """10 training steps, then 10 evaluation batches without torch.no_grad(), the outputs kept
    in a list (`keep`, the findings corpus's kept-logits) or only their argmax kept. The watch
    result (None unwatched) and the outputs, then a backward through them (the gradients)."""
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outputs = []
    block = am.watch(first=first) if watched else contextlib.nullcontext()
    with block as w:
        for _ in range(10):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        for i in range(10):
            output = model(x + i)
            outputs.append(output if keep else output.argmax(1))
    if keep:
        opt.zero_grad()
        torch.cat(outputs).sum().backward()
    grads = [p.grad for p in model.parameters()]
    return (w.result if watched else None), outputs, grads


def test_outputs_kept_after_the_last_backward_open_a_window_that_names_them():
    """GIVEN a training loop, then an evaluation loop keeping its outputs with their graphs
    (no backward after the last training step: no step end reads the counters) WHEN watched
    THEN a window opens once saved tensors pile up past 3 steps' worth, and its findings name
    `outputs`; the outputs and a later backward through them are the unwatched run's, bit for
    bit; evaluation keeping only the argmax opens none."""
    kept, outputs, grads = train_then_evaluate(keep=True)
    _, plain_outputs, plain_grads = train_then_evaluate(keep=True, watched=False)
    assert all(torch.equal(a, b) for a, b in zip(outputs, plain_outputs, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))
    assert len(kept.windows) == 1
    window = kept.windows[0]
    assert window.steps_text == "the ops after step 10"
    assert window.reason.startswith("saved tensors piled up with no backward call")
    assert [(f.kind, f.holder) for f in kept.findings] == [("kept-alive", "outputs")]
    text = render_watch_text(kept.report())
    assert "The ops after step 10 captured: saved tensors piled up" in text
    assert train_then_evaluate(keep=False)[0].windows == []
    # Every training step captured (the first window ends with them): the captured steps'
    # records size the limit, and the outputs kept after them open a second window.
    both, _, _ = train_then_evaluate(keep=True, first=10)
    assert [w.steps_text for w in both.windows] == ["steps 1-10", "the ops after step 10"]
    assert [(f.kind, f.holder) for f in both.findings] == [("kept-alive", "outputs")]
    text = render_watch_text(both.report(block="cell"))
    assert "When the capture of steps 1-10 ended, " in text  # not "when the cell ended"
    assert "When the cell ended, " in text  # the last window recorded to the cell's end


def test_watching_changes_no_value_or_gradient():
    """GIVEN the same training loop untracked and watched THEN weights are equal bit for bit."""
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(12):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    _, watched = correct_loop(12, first=2, every=5)
    for a, b in zip(model.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_inplace_error_is_pytorchs_own_in_a_counted_step():
    """GIVEN a saved tensor modified in place in a counted step THEN backward raises PyTorch's
    own error, as untracked."""
    x = torch.ones(3, requires_grad=True)

    def step():
        y = x.exp()
        y.add_(1)
        y.sum().backward()

    with pytest.raises(RuntimeError) as untracked:
        step()
    with pytest.raises(RuntimeError) as watched, am.watch(first=0):
        step()
    assert str(watched.value) == str(untracked.value)


def test_a_graph_is_freed_at_the_same_moment_in_a_counted_step():
    """GIVEN gc disabled and a saved input WHEN its variable and then the loss are deleted in a
    counted step THEN the tensor dies at the same moment as untracked (with the loss)."""

    def moments(watched: bool) -> list[bool]:
        x = torch.ones(3, requires_grad=True)
        with am.watch(first=0) if watched else contextlib.nullcontext():
            h = x * 2
            loss = h.sin().sum()  # sin saves its input h
            alive = weakref.ref(h)
            del h
            after_del_h = alive() is not None
            del loss
            return [after_del_h, alive() is not None]

    gc.disable()
    try:
        assert moments(False) == [True, False]
        assert moments(True) == [True, False]
    finally:
        gc.enable()


def test_an_out_of_memory_error_gets_a_post_mortem_and_reaches_the_user_unchanged(tmp_path):
    """GIVEN a loop keeping its losses that then asks the CPU allocator for far too much
    WHEN watched with save= THEN the same RuntimeError reaches the code, and the saved report
    says what autograd held: bytes, live roots, who holds them, the last steps."""
    model, x, y = model_and_data()
    losses = []
    path = tmp_path / "watch.json"
    with pytest.raises(RuntimeError) as raised, am.watch(first=0, save=path):
        for _ in range(4):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward(retain_graph=True)
            losses.append(loss)
        torch.empty(2**62, dtype=torch.uint8)
    assert "allocate" in str(raised.value)
    loaded = WatchTrace.from_json(json.loads(path.read_text()) and _strip_run(path.read_text()))
    oom = loaded.out_of_memory
    assert oom is not None and oom.live_roots == 4 and oom.retained_bytes > 0
    assert "losses[...]" in oom.holders
    text = render_watch_text(loaded.report())
    assert "Out of memory at step 5" in text and "`losses[...]`" in text


def _strip_run(text: str) -> str:
    document = json.loads(text)
    document.pop("run", None)
    return json.dumps(document)


def test_a_watch_round_trips_through_json():
    """GIVEN a watched leaking loop THEN its JSON loads back to the same steps, windows and text
    report."""
    result = leaking_loop(8, first=1)
    loaded = WatchTrace.from_json(result.to_json())
    assert loaded.steps == result.steps
    assert render_watch_text(loaded.report()) == render_watch_text(result.report())


def test_w_step_marks_steps_instead_of_backward_calls():
    """GIVEN code that calls w.step() after every second backward THEN steps follow w.step()."""
    x = torch.ones(3, requires_grad=True)
    with am.watch(first=0) as w:
        for _ in range(3):
            (x * 2).sum().backward()
            w.step()
            (x * 3).sum().backward()
            (x * 4).sum().backward()
            w.step()
    assert [s.backward_calls for s in w.result.steps] == [1, 2] * 3


def test_w_step_in_a_loop_without_backward_ends_every_step_from_the_first():
    """GIVEN an evaluation loop that keeps its outputs' graphs and calls w.step() each
    iteration, with no backward at all THEN each call ends a step: three steps, the kept
    bytes rising at each, none merged into the next."""
    model, x, _ = model_and_data()
    kept = []
    with am.watch(first=0) as w:
        for _ in range(3):
            kept.append(model(x))
            w.step()
    steps = w.result.steps
    assert [s.step for s in steps] == [1, 2, 3]
    assert [s.live_saved for s in steps] == [4, 8, 12]
    assert steps[0].retained_bytes < steps[1].retained_bytes < steps[2].retained_bytes


def test_a_watched_cell_shows_the_watch_report(shell):
    """GIVEN `%%trackgraph --watch --text -o w` on a cell keeping its losses THEN the cell's
    result is a WatchTrace, its text report says which steps were captured and why, and the
    window's finding names `losses`."""
    from IPython.utils.capture import capture_output

    cell = (
        "%%trackgraph --watch --text -o w\n"
        "model = torch.nn.Linear(4, 1)\n"
        "losses = []\n"
        "for step in range(12):\n"
        "    loss = model(torch.ones(2, 4)).sum()\n"
        "    loss.backward()\n"
        "    losses.append(loss)\n"
    )
    with capture_output() as captured:
        shell.run_cell(cell)
    w = shell.user_ns.pop("w")
    assert isinstance(w, WatchTrace) and w.steps_done == 12
    assert "Steps 5-7 captured: live backward roots grew from step 2." in captured.stdout
    assert any(f.holder == "losses" and f.line == 6 for f in w.findings), w.findings
    for name in ("model", "losses", "loss", "step"):
        shell.user_ns.pop(name, None)


def test_the_command_line_watches_a_script(tmp_path):
    """GIVEN a script keeping its losses WHEN `python -m autograd_magic run --watch` runs it
    THEN it exits 0, saves a watch file, and `report --text` prints the watch report."""
    import subprocess
    import sys

    script = tmp_path / "leak.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "losses = []\n"
        "for step in range(20):\n"
        "    loss = model(torch.ones(2, 4)).sum()\n"
        "    loss.backward()\n"
        "    losses.append(loss)\n"
    )
    out = tmp_path / "leak.json"
    run = [sys.executable, "-m", "autograd_magic", "run", "--watch", "-o", str(out), str(script)]
    done = subprocess.run(run, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "Steps 5-7 captured: live backward roots grew from step 2." in done.stderr
    report = [sys.executable, "-m", "autograd_magic", "report", str(out), "--text"]
    printed = subprocess.run(report, capture_output=True, text=True, check=True).stdout
    assert printed.startswith("autograd_magic watch (finished)")
    assert "`losses` holds" in printed


LOOP_CELL = (
    "%%trackgraph --text -o w\n"
    "model = torch.nn.Linear(4, 1)\n"
    "losses = []\n"
    "for step in range({steps}):\n"
    "    loss = model(torch.ones(2, 4)).sum()\n"
    "    loss.backward()\n"
    "    losses.append(loss)\n"
)


def test_a_short_cell_is_recorded_whole_by_default(shell):
    """GIVEN a default `%%trackgraph` cell of 5 steps THEN it is recorded whole, as a Trace,
    exactly as `track()` records it (a short cell never pays for or shows the watch)."""
    from IPython.utils.capture import capture_output

    with capture_output():
        shell.run_cell(LOOP_CELL.format(steps=5))
    trace = shell.user_ns.pop("w")
    assert isinstance(trace, am.Trace) and len(trace.backward_calls) == 5
    assert any(f.holder == "losses" for f in trace.findings)


def test_a_long_cell_records_its_first_steps_and_counts_the_rest_by_default(shell):
    """GIVEN a default `%%trackgraph` cell of 60 steps keeping its losses THEN the first 20
    steps are recorded in full (their findings name `losses`), the other 40 are counted, and
    the counted steps' roots grow step after step."""
    from IPython.utils.capture import capture_output

    from autograd_magic.magic import CELL_FULL_STEPS

    with capture_output() as captured:
        shell.run_cell(LOOP_CELL.format(steps=60))
    watched = shell.user_ns.pop("w")
    assert isinstance(watched, WatchTrace) and watched.steps_done == 60
    assert [s.captured for s in watched.steps].count(True) >= CELL_FULL_STEPS == 20
    assert watched.windows[0].steps_text == "steps 1-20"
    assert any(f.holder == "losses" for f in watched.findings)
    assert watched.steps[-1].live_roots == 60
    assert "Steps 1-20 captured: the first steps." in captured.stdout
    for name in ("model", "losses", "loss", "step"):
        shell.user_ns.pop(name, None)


# ----- bytes by module, where that is cheap ------------------------------------------------------


def test_the_module_rule_keeps_attribution_on_long_steps_and_drops_it_on_short_ones():
    """GIVEN the measured cost of the module hooks WHEN a step's module calls would cost more
    than 2% of it THEN attribution stops, and the reason names the calls and the step time."""
    from autograd_magic.model.watch import module_hooks_too_costly

    assert module_hooks_too_costly(100, 0.080) == ""  # a BERT step: 100 calls, 80 ms
    why = module_hooks_too_costly(4, 0.0003)  # a 4-module MLP step of 0.3 ms
    assert (
        why == "its hooks would have cost about 8% of each step (4 module calls in a 0.30 ms step)"
    )


def _oom_loop(model: torch.nn.Module, x: torch.Tensor, steps: int = 10) -> WatchTrace:
    """A correct loop (no escalation), then an allocation far too large, watched."""
    with pytest.raises(RuntimeError), am.watch(first=0) as w:
        for _ in range(steps):
            model(x).square().mean().backward()
        kept = model(x).square().mean()  # a graph alive when memory runs out
        torch.empty(2**62, dtype=torch.uint8)
    del kept
    return w.trace


def test_tiny_steps_of_many_modules_stop_attributing_bytes_to_modules_and_say_so():
    """GIVEN a step of thirty-two modules doing next to nothing (their hooks would cost far more
    than 2% of it)
    WHEN watched THEN after five timed counted steps (after three untimed: the first, and two
    to warm up) module attribution stops, and the
    out-of-memory report says from which step and why instead of naming modules."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), *[torch.nn.Identity() for _ in range(30)])
    trace = _oom_loop(model, torch.randn(1, 2))
    assert trace.modules_off.startswith("from step 9: its hooks would have cost about ")
    assert "(32 module calls in a " in trace.modules_off
    oom = trace.out_of_memory
    assert oom is not None and oom.by_module == () and oom.modules_off == trace.modules_off
    text = render_watch_text(trace.report())
    assert f"By module: not recorded {trace.modules_off}." in text
    assert "By top-level module" not in text
    assert WatchTrace.from_json(trace.to_json()).modules_off == trace.modules_off


def test_long_steps_keep_bytes_by_module():
    """GIVEN a step of one module doing milliseconds of work WHEN watched THEN module
    attribution stays on and the out-of-memory report names the module."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh())
    trace = _oom_loop(model, torch.randn(2048, 512))
    assert trace.modules_off == ""
    oom = trace.out_of_memory
    assert oom is not None and oom.by_module[0][0] == "Sequential"
    assert "By top-level module: Sequential: " in render_watch_text(trace.report())


def test_the_html_report_draws_pictures_only_for_windows_with_findings():
    """GIVEN a correct loop (its first step captured, nothing found) and a leaking one (a window
    with findings) WHEN their watch reports are made HTML THEN the correct loop's has no
    picture and says why, the leaking loop's window has its timeline and graph."""
    from autograd_magic.views.html import NO_PICTURES, watch_page

    correct, _ = correct_loop(6)
    page = watch_page(correct.report())
    assert "<img" not in page and NO_PICTURES in page
    leaking = watch_page(leaking_loop(8, first=0).report())
    assert leaking.count("<img") == 2 and NO_PICTURES not in leaking


def test_a_live_panel_shows_the_counted_steps_progress_between_captures():
    """GIVEN a watch with the first 2 steps captured, its panel made before the loop runs (as
    the magic makes it) and told of counted steps WHEN 6 steps run THEN the listener is told at
    each counted step end (interval 0), the panel shows the first steps' record (drawn once
    when they ended, between refreshes) and its status line says how far the counted steps
    got; a listener that raises is dropped, the loop unharmed."""
    from autograd_magic.views.panel import TracePanel

    model, x, y = model_and_data()
    told: list[int] = []
    with am.watch(first=2) as w:
        panel = TracePanel(w.first_recorder.trace)
        empty = panel.summary.value
        w.listen_steps(
            lambda result: (told.append(result.steps_done), panel.counted_update(result)), 0
        )
        for _ in range(6):
            torch.nn.functional.mse_loss(model(x), y).backward()
    assert told == [3, 4, 5, 6]
    status = panel.status.value
    assert "running: step 6 counted (steps 1-2 captured in full); 1 live backward root" in status
    assert "at its end. Below: steps 1-2" in status  # the numbers below are the first steps'
    assert panel.summary.value != empty and "<b>2</b>" in panel.summary.value  # 2 backward calls
    assert "When the capture of steps 1-2 ended" in panel.findings.value  # the cell runs on
    calls = []

    def failing(result):
        calls.append(result.steps_done)
        raise ZeroDivisionError

    with am.watch(first=0) as w:
        w.listen_steps(failing, 0)
        for _ in range(3):
            torch.nn.functional.mse_loss(model(x), y).backward()
    assert w.result.steps_done == 3 and calls == [1]


def _compiled_training(block) -> tuple[list[torch.Tensor], int]:
    """10 SGD steps of a compiled (eager backend) MLP inside `block`: its weights and the
    graphs Dynamo compiled."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model, x, y = model_and_data()
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with block:
        for _ in range(10):
            opt.zero_grad()
            torch.nn.functional.mse_loss(compiled(x), y).backward()
            opt.step()
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    return [p.detach().clone() for p in model.parameters()], graphs


def test_counted_steps_leave_a_compiled_model_compiling_as_untracked():
    """GIVEN a compiled MLP trained 10 steps WHEN watched with nothing captured THEN it
    compiles the one graph it compiles unwatched and ends with the same weights, bit for bit;
    with its first 2 steps captured, one graph more (Dynamo guards the function-mode stack, as
    under track()), the weights still the same, and no warning either way."""
    with warnings.catch_warnings(record=True) as unwatched:
        warnings.simplefilter("always")
        plain, plain_graphs = _compiled_training(contextlib.nullcontext())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counted, counted_graphs = _compiled_training(am.watch(first=0))
        captured, captured_graphs = _compiled_training(am.watch(first=2))
    # The hook that takes a closed window's mode out is not one torch counts: no "global hooks
    # on modules" warning from the compiled module, nor any other that unwatched code does not
    # get (Dynamo's own, as on Python 3.13.0, come unwatched too).
    assert {str(w.message) for w in caught} <= {str(w.message) for w in unwatched}
    # torch 2.4's Dynamo compiles under the function mode (README, Supported versions) and
    # does not guard its stack: a window compiles no graph more there.
    more = 0 if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 5) else 1
    assert (plain_graphs, counted_graphs, captured_graphs) == (1, 1, 1 + more)
    for weights in (counted, captured):
        assert all(torch.equal(a, b) for a, b in zip(plain, weights, strict=True))
