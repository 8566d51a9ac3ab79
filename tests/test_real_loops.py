"""Findings on training loops written the way people write them (issue 11).

Broken: a recurrent state carried across iterations without detach, the `retain_graph=True`
"fix", then the optimizer's step breaking the next backward. The carried variable is the root
cause, reported first at the line that carries it; the rest are its consequences, one finding
per cause. Correct: ordinary loops of many shapes, which must produce no findings at all.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from markers import marker_lines
from torch.utils.checkpoint import checkpoint

import autograd_magic as am
from autograd_magic.analysis.result import analyze
from autograd_magic.report.buffers import buffer_table

line_of = marker_lines(__file__)
INPLACE = "modified by an inplace operation"


def optimizer(kind: str, params) -> torch.optim.Optimizer:
    params = list(params)
    return torch.optim.SGD(params, lr=0.1) if kind == "sgd" else torch.optim.Adam(params, lr=0.01)


# ----- broken: a carried state ----------------------------------------------------------------
def lstm_loop(opt_kind: str, keep_history: bool) -> am.Trace:
    torch.manual_seed(0)
    rnn, head = nn.LSTM(4, 8), nn.Linear(8, 1)
    opt = optimizer(opt_kind, [*rnn.parameters(), *head.parameters()])
    xs, ys = torch.randn(3, 3, 2, 4), torch.randn(3, 3, 2, 1)
    with am.track() as trace:
        h = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
        history = []
        with pytest.raises(RuntimeError, match=INPLACE):
            for x, y in zip(xs, ys, strict=True):
                out, h = rnn(x, h)  # L:LSTM
                loss = F.mse_loss(head(out), y)
                opt.zero_grad()
                loss.backward(retain_graph=True)  # L:LSTM_BACKWARD
                opt.step()  # L:LSTM_STEP
                if keep_history:
                    history.append(loss)  # L:LSTM_HISTORY
    return trace


def gru_loop(opt_kind: str, keep_history: bool) -> am.Trace:
    torch.manual_seed(0)
    rnn, head = nn.GRU(4, 8), nn.Linear(8, 1)
    opt = optimizer(opt_kind, [*rnn.parameters(), *head.parameters()])
    xs, ys = torch.randn(3, 3, 2, 4), torch.randn(3, 3, 2, 1)
    with am.track() as trace:
        h = torch.zeros(1, 2, 8)
        history = []
        with pytest.raises(RuntimeError, match=INPLACE):
            for x, y in zip(xs, ys, strict=True):
                out, h = rnn(x, h)  # L:GRU
                loss = F.mse_loss(head(out), y)
                opt.zero_grad()
                loss.backward(retain_graph=True)  # L:GRU_BACKWARD
                opt.step()  # L:GRU_STEP
                if keep_history:
                    history.append(loss)  # L:GRU_HISTORY
    return trace


def rnncell_loop(opt_kind: str, keep_history: bool) -> am.Trace:
    torch.manual_seed(0)
    cell, head = nn.RNNCell(4, 8), nn.Linear(8, 1)
    opt = optimizer(opt_kind, [*cell.parameters(), *head.parameters()])
    xs, ys = torch.randn(3, 2, 4), torch.randn(3, 2, 1)
    with am.track() as trace:
        hidden = torch.zeros(2, 8)
        history = []
        with pytest.raises(RuntimeError, match=INPLACE):
            for x, y in zip(xs, ys, strict=True):
                hidden = cell(x, hidden)  # L:CELL
                loss = F.mse_loss(head(hidden), y)
                opt.zero_grad()
                loss.backward(retain_graph=True)  # L:CELL_BACKWARD
                opt.step()  # L:CELL_STEP
                if keep_history:
                    history.append(loss)  # L:CELL_HISTORY
    return trace


LOOPS = {
    # loop, carried variable, marker, the detach code, parameters the step changed under a graph
    "lstm": (
        lstm_loop,
        "h",
        "LSTM",
        "h = tuple(t.detach() for t in h)",
        "updated rnn.weight_ih_l0, rnn.weight_hh_l0, ... (5 parameters) in place",
    ),
    "gru": (gru_loop, "h", "GRU", "h = h.detach()", "updated rnn.weight_hh_l0, head.weight in"),
    "rnncell": (
        rnncell_loop,
        "hidden",
        "CELL",
        "hidden = hidden.detach()",
        "updated head.weight, cell.weight_hh in place",
    ),
}


@pytest.mark.parametrize("keep_history", [False, True], ids=["plain", "history"])
@pytest.mark.parametrize("opt_kind", ["sgd", "adam"])
@pytest.mark.parametrize("model", sorted(LOOPS))
def test_a_carried_state_is_the_root_cause_and_the_rest_its_consequences(
    model, opt_kind, keep_history
):
    loop, holder, marker, fix, updated = LOOPS[model]
    # WHEN the loop carries its state, retains the graph and steps, until backward fails
    trace = loop(opt_kind, keep_history)
    found = trace.findings
    # THEN the carried variable comes first, at the line that carries it, with the exact fix
    assert [f.kind for f in found[:3]] == ["graph-growth", "retained-graph", "inplace-on-saved"]
    growth, retained, step, *rest = found
    # (a history of losses holding their graphs is a problem of its own, named at its line)
    assert [(f.kind, f.holder, f.line) for f in rest] in (
        [],
        [("kept-alive", "history", line_of(f"{marker}_HISTORY"))] if keep_history else [],
    )
    assert growth.holder == holder
    assert growth.line == line_of(marker)
    assert f"through `{holder}`, carried at line {line_of(marker)}" in growth.message
    assert f"`{fix}`" in growth.message
    assert "retain_graph=True is no longer needed" in growth.message
    assert line_of(f"{marker}_BACKWARD") in growth.related_lines
    # AND retain_graph and the optimizer's update are its consequences, not problems of their own
    because = f"Because `{holder}` carries the previous iteration's graph (line {line_of(marker)}"
    assert retained.line == line_of(f"{marker}_BACKWARD")
    assert retained.message.startswith(because)
    assert f", called {len(trace.backward_calls)} times)" in retained.message
    detach_first = f"Once `{holder}` is detached, drop retain_graph=True: each backward then frees"
    assert detach_first in retained.message
    # AND one optimizer step is one finding naming every parameter it changed under the graph
    assert step.line == line_of(f"{marker}_STEP")
    assert step.holder == "opt"
    assert step.message.startswith(because)
    assert updated in step.message
    assert f"Detaching `{holder}` fixes this too." in step.message
    assert "run every backward before optimizer.step()" not in step.message


def test_the_optimizer_step_without_a_carried_state_keeps_its_own_advice():
    torch.manual_seed(0)
    lin = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    with am.track() as trace:
        loss = lin(torch.randn(8, 4)).pow(2).sum()
        loss.backward(retain_graph=True)
        opt.step()  # L:LONE_STEP
        with pytest.raises(RuntimeError, match=INPLACE):
            loss.backward()  # L:LONE_FAILS
    (step,) = [f for f in trace.findings if f.kind == "inplace-on-saved"]
    assert step.line == line_of("LONE_STEP")
    assert "run every backward before optimizer.step()" in step.message
    # (the backward did fail: the finding says why, not that it will, nor PyTorch's text again)
    assert f"that is why the backward at line {line_of('LONE_FAILS')} failed" in step.message
    assert "will fail" not in step.message and INPLACE not in step.message
    assert "Because" not in step.message


def test_a_retained_graph_walked_again_is_needed_and_the_step_that_broke_it_is_the_cause():
    # (issue 22, class 3: "drop retain_graph" would break the second backward)
    torch.manual_seed(0)
    lin = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    with am.track() as trace:
        loss = lin(x).pow(2).sum()
        with pytest.raises(RuntimeError, match=INPLACE):
            for _ in range(3):
                loss.backward(retain_graph=True)  # L:THRICE
                if _ == 1:
                    opt.step()
    assert [f.kind for f in trace.findings] == ["inplace-on-saved"]
    assert "run every backward before optimizer.step()" in trace.findings[0].message


# ----- correct loops: no findings at all --------------------------------------------------------
def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))


def batches(n: int = 3):
    torch.manual_seed(1)
    return [(torch.randn(8, 6), torch.randn(8, 1)) for _ in range(n)]


def plain_sgd_with_item_logging():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    history, total = [], 0.0
    for x, y in batches():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        history.append(loss.item())
        total += loss.item()


def gradient_accumulation():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(batches(4)):
        loss = F.mse_loss(model(x), y) / 2
        loss.backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()


def amp_autocast_bfloat16():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in batches():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()


def gradient_clipping():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def gan_with_two_optimizers():
    torch.manual_seed(0)
    gen, disc = nn.Sequential(nn.Linear(3, 6), nn.Tanh()), nn.Sequential(nn.Linear(6, 1))
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
    for real, _ in batches():
        fake = gen(torch.randn(8, 3))
        opt_d.zero_grad()
        d_loss = F.binary_cross_entropy_with_logits(
            disc(real), ones
        ) + F.binary_cross_entropy_with_logits(disc(fake.detach()), zeros)
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(disc(fake), ones)
        g_loss.backward()
        opt_g.step()


def teacher_forcing():
    torch.manual_seed(0)
    cell, emb, out = nn.GRUCell(4, 8), nn.Embedding(5, 4), nn.Linear(8, 5)
    opt = torch.optim.Adam([*cell.parameters(), *emb.parameters(), *out.parameters()], lr=1e-2)
    for _ in range(3):
        target = torch.randint(0, 5, (6, 2))
        hidden, loss = torch.zeros(2, 8), 0.0
        opt.zero_grad()
        for t in range(5):
            hidden = cell(emb(target[t]), hidden)
            loss = loss + F.cross_entropy(out(hidden), target[t + 1])
        loss.backward()
        opt.step()


def tbptt_with_detach():
    torch.manual_seed(0)
    rnn, head = nn.LSTM(4, 8), nn.Linear(8, 1)
    opt = torch.optim.SGD([*rnn.parameters(), *head.parameters()], lr=0.1)
    h = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    history = []
    for x, y in zip(torch.randn(3, 3, 2, 4), torch.randn(3, 3, 2, 1), strict=True):
        h = tuple(t.detach() for t in h)
        out, h = rnn(x, h)
        loss = F.mse_loss(head(out), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item())


def rnncell_detached():
    torch.manual_seed(0)
    cell, head = nn.RNNCell(4, 8), nn.Linear(8, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
    hidden = torch.zeros(2, 8)
    for x, y in zip(torch.randn(3, 2, 4), torch.randn(3, 2, 1), strict=True):
        hidden = cell(x, hidden.detach())
        loss = F.mse_loss(head(hidden), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def gru_detached_with_adam():
    torch.manual_seed(0)
    rnn, head = nn.GRU(4, 8), nn.Linear(8, 1)
    opt = torch.optim.Adam([*rnn.parameters(), *head.parameters()], lr=1e-2)
    h = torch.zeros(1, 2, 8)
    for x, y in zip(torch.randn(3, 3, 2, 4), torch.randn(3, 3, 2, 1), strict=True):
        out, h = rnn(x, h.detach())
        loss = F.mse_loss(head(out), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def ema_of_weights():
    model, ema = mlp(), mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches():
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                e.mul_(0.9).add_(p, alpha=0.1)


def validation_under_no_grad():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    val_x, val_y = torch.randn(8, 6), torch.randn(8, 1)
    val_losses = []
    for x, y in batches():
        model.train()
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            val_losses.append(F.mse_loss(model(val_x), val_y))


def with_a_scheduler():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for x, y in batches():
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()


def activation_checkpointing():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches():
        opt.zero_grad()
        out = checkpoint(model, x, use_reentrant=False)
        F.mse_loss(out, y).backward()
        opt.step()


def two_losses_summed():
    torch.manual_seed(0)
    trunk, a, b = nn.Linear(6, 8), nn.Linear(8, 1), nn.Linear(8, 1)
    opt = torch.optim.SGD([*trunk.parameters(), *a.parameters(), *b.parameters()], lr=0.1)
    for x, y in batches():
        opt.zero_grad()
        feat = torch.relu(trunk(x))
        loss = F.mse_loss(a(feat), y) + 0.5 * F.mse_loss(b(feat), y)
        loss.backward()
        opt.step()


def batchnorm_dropout_train_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Dropout(0.2))
    head = nn.Linear(12, 1)
    opt = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=1e-3)

    def train_step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(head(model(x)), y)
        loss.backward()
        opt.step()
        return loss.detach()

    losses = [train_step(x, y) for x, y in batches()]
    assert len(losses) == 3


def classification_with_accuracy():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    correct = 0
    for x, _ in batches():
        labels = torch.randint(0, 3, (8,))
        opt.zero_grad(set_to_none=False)
        logits = model(x)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        opt.step()
        correct += (logits.argmax(1) == labels).sum().item()


def retain_graph_for_two_backwards_then_step():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches():
        opt.zero_grad()
        out = model(x)
        F.mse_loss(out, y).backward(retain_graph=True)
        out.abs().mean().backward()
        opt.step()


CORRECT = [
    plain_sgd_with_item_logging,
    gradient_accumulation,
    amp_autocast_bfloat16,
    gradient_clipping,
    gan_with_two_optimizers,
    teacher_forcing,
    tbptt_with_detach,
    rnncell_detached,
    gru_detached_with_adam,
    ema_of_weights,
    validation_under_no_grad,
    with_a_scheduler,
    activation_checkpointing,
    two_losses_summed,
    batchnorm_dropout_train_step,
    classification_with_accuracy,
    retain_graph_for_two_backwards_then_step,
]


@pytest.mark.parametrize("loop", CORRECT, ids=[f.__name__ for f in CORRECT])
def test_a_correct_loop_has_no_findings(loop):
    with am.track() as trace:
        loop()
    assert trace.backward_calls
    assert trace.findings == []


def test_correct_loops_run_at_top_level_have_no_findings():
    # The same LSTM loop as above, written correctly in the traced block itself, where its
    # variables (`h`, `out`, `loss`) stay bound after the block: the last iteration's own graph.
    torch.manual_seed(0)
    rnn, head = nn.LSTM(4, 8), nn.Linear(8, 1)
    opt = torch.optim.Adam([*rnn.parameters(), *head.parameters()], lr=1e-2)
    with am.track() as trace:
        h = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
        history = []
        for x, y in zip(torch.randn(3, 3, 2, 4), torch.randn(3, 3, 2, 1), strict=True):
            h = tuple(t.detach() for t in h)
            out, h = rnn(x, h)
            loss = F.mse_loss(head(out), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(loss.item())
    assert trace.holders
    assert trace.findings == []


def test_a_running_total_is_kept_alive_not_a_carried_state():
    # `total += loss` links every iteration's graph too, but no backward walks the total.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with am.track() as trace:
        total = 0
        for x, y in batches():
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total += loss  # L:TOTAL
    assert [(f.kind, f.holder, f.line) for f in trace.findings] == [
        ("kept-alive", "total", line_of("TOTAL"))
    ]


# ----- names ----------------------------------------------------------------------------------
def test_optimizer_state_is_named_as_the_user_reaches_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    with am.track() as trace:
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
    labels = {b.label for b in trace.version_bumps}
    assert "opt.state[model.0.weight]['exp_avg']" in labels
    assert "opt.state[model.2.bias]['exp_avg_sq']" in labels
    assert not any("\x00" in label for label in labels)


def test_every_saved_tensor_row_has_a_name_or_an_op_label():
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with am.track() as trace:
        hidden = torch.tanh(lin(x))
        loss = hidden.pow(2).sum()
    table = buffer_table(analyze(trace))
    column = table.headers.index("tensor")
    rows = {row[column] for row in table.rows}
    assert "" not in rows
    assert "hidden" in rows  # tanh saves its output, which the user called `hidden`
    assert loss.requires_grad


# ----- a script run with exec inside the block ------------------------------------------------
SCRIPT = """\
import torch
losses = []
w = torch.randn(4, requires_grad=True)
for _ in range(3):
    loss = (w * torch.randn(4)).exp().sum()
    loss.backward()
    losses.append(loss)
"""


def test_findings_in_an_execd_script_point_at_the_scripts_lines(tmp_path):
    # As `%run train.py` in a cell: the script runs in the cell's namespace, inside the block.
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    cell = (
        "with am.track() as trace:\n"
        f"    exec(compile(open({str(path)!r}).read(), {str(path)!r}, 'exec'), globals())\n"
    )
    namespace: dict = {"am": am}
    exec(compile(cell, str(tmp_path / "cell.py"), "exec"), namespace)
    (kept,) = namespace["trace"].findings
    assert (kept.kind, kept.holder) == ("kept-alive", "losses")
    # THEN the lines are the script's (the exec call is line 2 of the cell)
    assert kept.line == 7 and kept.related_lines == (5,)
    assert "(`losses.append(loss)`)" in kept.message


def test_traces_kept_from_earlier_cells_do_not_use_up_the_naming_time():
    # GIVEN a namespace holding a large trace from an earlier block (`%%trackgraph -o kept`)
    x = torch.ones(4, requires_grad=True)
    with am.track() as kept:
        history = [x * i for i in range(30_000)]
    assert len(kept.nodes) >= 30_000
    del history
    # WHEN a small block runs with a small time budget for naming
    with am.track(name_budget_s=0.05) as trace:
        y = x.exp()
    # THEN naming finished (no blind spot) and the new tensor is named
    assert [b.kind for b in trace.blindspots] == []
    assert {b.label for b in trace.buffers} == {"y"}
    assert kept.finished and y.requires_grad


def test_parameters_saved_for_a_backward_that_ran_keep_their_names():
    # GIVEN a Linear whose input needs a gradient (so addmm saves the weight), backpropagated
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    with am.track() as trace:
        lin(x).pow(2).sum().backward()
    # THEN the saved weight is still named after the parameter (its storage lives on)
    labels = {b.label for b in trace.buffers if b.freed}
    assert "view of lin.weight" in labels  # addmm saves weight.t()
    # AND a released input is not named after whatever now holds its old address
    assert all(not label or "lin." in label for label in labels)
