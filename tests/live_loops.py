"""Growth bugs long enough to time the live hint (issue 35, class 9): the findings corpus's
growth bugs run for `STEPS` steps (its own loops run 3), and shapes it lacks, each naming where
it came from. Every loop returns the trace of its block; `tests/test_live_hint.py` attaches the
live listener to it through `am.track`, as the panel does."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import corpus_lines
import corpus_writes
import findings_corpus
import torch
import torch.nn as nn
import torch.nn.functional as F

import autograd_magic as am

STEPS = 12


@dataclass(frozen=True)
class Bug:
    """A loop whose graphs pile up from step `start` (1-based: the first step whose graph is
    kept), over at least `start + 4` steps."""

    loop: Callable[[], am.Trace]
    start: int
    source: str


def mlp_data(n: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, list[Any]]:
    """The findings corpus's MLP, optimizer and `n` batches (`STEPS` when 0)."""
    findings_corpus.seed()
    n = n or STEPS
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, [(torch.randn(8, 6), torch.randn(8, 1)) for _ in range(n)]


def total_loss() -> am.Trace:
    model, opt, data = mlp_data()
    with am.track() as trace:
        total = 0
        for x, y in data:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total += loss
    return trace


def loss_history(every: int = 1, first: int = 0) -> am.Trace:
    """`losses.append(loss)` at every `every`th step from step `first` (0-based)."""
    model, opt, data = mlp_data(STEPS + first)
    with am.track() as trace:
        losses = []
        for step, (x, y) in enumerate(data):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if step >= first and (step - first) % every == 0:
                losses.append(loss)
    return trace


def logger() -> am.Trace:
    model, opt, data = mlp_data()
    log = findings_corpus.Logger()
    with am.track() as trace:
        for x, y in data:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            log.log(loss)
    return trace


class Trainer:
    """A hand-rolled trainer keeping `self.loss` and a per-step dict of it."""

    def __init__(self) -> None:
        self.model, self.opt, self.data = mlp_data()
        self.history: dict[int, Any] = {}

    def train_step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        self.opt.zero_grad()
        self.loss = F.mse_loss(self.model(x), y)
        self.loss.backward()
        self.opt.step()
        self.history[step] = self.loss


def self_loss_dict() -> am.Trace:
    trainer = Trainer()
    with am.track() as trace:
        for step, (x, y) in enumerate(trainer.data):
            trainer.train_step(step, x, y)
    return trace


def running_stat() -> am.Trace:
    findings_corpus.seed()
    norm, head = findings_corpus.RunningNorm(6), nn.Linear(6, 1)
    opt = torch.optim.SGD([*norm.parameters(), *head.parameters()], lr=0.1)
    with am.track() as trace:
        for _ in range(STEPS):
            x, y = torch.randn(8, 6), torch.randn(8, 1)
            loss = F.mse_loss(head(norm(x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return trace


def carried_state() -> am.Trace:
    """The word LM's hidden state carried across batches with retain_graph=True; the cell is
    frozen (only the head learns), so no in-place update stops the loop."""
    findings_corpus.seed()
    cell, head = nn.GRUCell(4, 8), nn.Linear(8, 1)
    cell.requires_grad_(False)
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    xs, ys = torch.randn(STEPS, 2, 4), torch.randn(STEPS, 2, 1)
    with am.track() as trace:
        state = torch.zeros(2, 8, requires_grad=True)
        for x, y in zip(xs, ys, strict=True):
            state = cell(x, state)
            loss = F.mse_loss(head(state), y)
            opt.zero_grad()
            loss.backward(retain_graph=True)
            opt.step()
    return trace


def validation_outputs() -> am.Trace:
    model, opt, data = mlp_data()
    x_val = torch.randn(8, 6)
    with am.track() as trace:
        val = []
        for x, y in data:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            val.append(model(x_val))
    return trace


def accumulated_total() -> am.Trace:
    """Gradient accumulation over 4 micro-batches, its logged loss summed as a tensor."""
    model, opt, data = mlp_data(4 * STEPS // 2)
    with am.track() as trace:
        running = 0
        for i, (x, y) in enumerate(data):
            loss = F.mse_loss(model(x), y) / 4
            loss.backward()
            running += loss
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()
    return trace


def gan_losses() -> am.Trace:
    """DCGAN's loop (3 backward calls a step) keeping `G_losses.append(errG)`."""
    netG, netD, optimizerD, optimizerG, _ = findings_corpus.gan_models()
    criterion = nn.BCELoss()
    data = [torch.randn(8, 16) for _ in range(STEPS - 4)]  # 3 backward calls a step
    with am.track() as trace:
        G_losses = []
        for real in data:
            netD.zero_grad()
            errD_real = criterion(netD(real), torch.full((8,), 1.0))
            errD_real.backward()
            fake = netG(torch.randn(8, 8))
            errD_fake = criterion(netD(fake.detach()), torch.full((8,), 0.0))
            errD_fake.backward()
            errD = errD_real + errD_fake
            optimizerD.step()
            netG.zero_grad()
            errG = criterion(netD(fake), torch.full((8,), 1.0))
            errG.backward()
            optimizerG.step()
            G_losses.append(errG)
            del errD
    return trace


def word_lm_old_sgd() -> am.Trace:
    """corpus_writes' 2017 word_language_model update (`p.data.add_(-lr, p.grad.data)`), the
    hidden state carried without repackage_hidden and retain_graph=True, for `STEPS` batches."""
    findings_corpus.seed()
    model = corpus_writes.LSTMLM()
    train_data = torch.randint(0, 20, (2 * STEPS + 1, 2))
    with am.track() as trace, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the deprecated add_ overload
        hidden = model.init_hidden(2)
        for i in range(0, 2 * STEPS, 2):
            output, hidden = model(train_data[i : i + 2], hidden)
            loss = F.nll_loss(output, train_data[i + 1 : i + 3].reshape(-1))
            model.zero_grad()
            loss.backward(retain_graph=True)
            for p in model.parameters():
                p.data.add_(-20, p.grad.data)
    return trace


def hidden_retain_graph() -> am.Trace:
    """corpus_fixes' truncated BPTT with retain_graph=True and the update after the sequence,
    over a sequence of `STEPS` chunks."""
    findings_corpus.seed()
    cell, head = nn.RNNCell(4, 8), nn.Linear(8, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
    xs, ys = torch.randn(STEPS, 2, 4), torch.randn(STEPS, 2, 1)
    opt.zero_grad()
    with am.track() as trace:
        hidden = torch.zeros(2, 8)
        for x, y in zip(xs, ys, strict=True):
            hidden = cell(x, hidden)
            loss = F.mse_loss(head(hidden), y)
            loss.backward(retain_graph=True)
    opt.step()
    return trace


def hook_features_kept() -> am.Trace:
    """corpus_lines' forward hook appending each output to a list, for `STEPS` batches."""
    findings_corpus.seed()
    model, data = corpus_lines.small_net(), corpus_lines.batches(STEPS)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    features = []
    handle = model[1].register_forward_hook(lambda module, i, output: features.append(output))
    with am.track() as trace:
        for x, y in data:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    handle.remove()
    return trace


def multitask_retain_each() -> am.Trace:
    """corpus_lines' two task losses, each backward with retain_graph=True, summed as tensors
    into `running_loss` (2 backward calls a step)."""
    findings_corpus.seed()
    model = corpus_lines.TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with am.track() as trace:
        running_loss = 0.0
        for _ in range(STEPS):
            x, ya, yb = torch.randn(8, 6), torch.randn(8, 1), torch.randint(0, 3, (8,))
            pa, pb = model(x)
            loss_a, loss_b = F.mse_loss(pa, ya), F.cross_entropy(pb, yb)
            opt.zero_grad()
            loss_a.backward(retain_graph=True)
            loss_b.backward(retain_graph=True)
            opt.step()
            running_loss += loss_a + loss_b
    return trace


FORUM = "discuss.pytorch.org"
BUGS = {
    "total-loss": Bug(total_loss, 1, f"{FORUM} 'CUDA memory continuously increases'"),
    "loss-history": Bug(loss_history, 1, f"{FORUM} 'Memory leak when appending loss'"),
    "logger": Bug(logger, 1, "a wandb/tensorboard-style logger given the loss tensor"),
    "running-stat": Bug(running_stat, 1, f"{FORUM} 'memory leak in custom batchnorm'"),
    "carried-state": Bug(carried_state, 1, "word_language_model with retain_graph=True"),
    "word-lm-old-sgd": Bug(word_lm_old_sgd, 1, "pytorch/examples word_language_model (2017)"),
    "hidden-retain-graph": Bug(hidden_retain_graph, 1, f"{FORUM} 'RNN memory grows'"),
    "hook-features-kept": Bug(hook_features_kept, 1, "Grad-CAM-style hook keeping outputs"),
    "multitask-retain-each": Bug(multitask_retain_each, 1, f"{FORUM} multi-task losses"),
    "self-loss-dict": Bug(self_loss_dict, 1, f"{FORUM} 'memory leak storing self.loss'"),
    "validation-outputs": Bug(validation_outputs, 1, "outputs kept without no_grad"),
    "late-loss-history": Bug(lambda: loss_history(first=10), 11, "loss-history from step 11"),
    "every-other-loss": Bug(lambda: loss_history(every=2), 1, "loss-history every 2nd step"),
    "accumulated-total": Bug(accumulated_total, 1, "nanoGPT-style accumulation, summed loss"),
    "gan-losses": Bug(gan_losses, 1, "pytorch/examples dcgan/main.py keeping errG"),
}
