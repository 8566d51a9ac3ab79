"""Corpus family of fixes that must fit what the code means (issue 35): a masked weight made
once in `__init__` or in `forward`, predictions collected in an evaluation loop with grad on or
under inference_mode, and a carried hidden state kept with retain_graph=True."""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from corpus_base import TWICE, Case, Expect, raises, seed
from markers import marker_lines

import autograd_magic as am

line_of = marker_lines(__file__)


class MaskedLinear(nn.Module):
    """A linear layer with a fixed connectivity mask; `in_forward` False makes the masked weight
    once, in `__init__` (discuss.pytorch.org "masked weight: backward through the graph a second
    time"), True recomputes it at each call as torch.nn.utils.prune's forward pre-hook does."""

    def __init__(self, i: int, o: int, in_forward: bool) -> None:
        super().__init__()
        self.in_forward = in_forward
        self.weight = nn.Parameter(torch.randn(o, i) * 0.3)
        self.bias = nn.Parameter(torch.zeros(o))
        self.register_buffer("mask", (torch.rand(o, i) > 0.5).float())
        if not in_forward:
            self.masked_weight = self.weight * self.mask  # L:MASK_INIT

    def forward(self, x):
        weight = self.weight * self.mask if self.in_forward else self.masked_weight
        return F.linear(x, weight, self.bias)


def _masked(in_forward: bool) -> am.Trace:
    seed()
    data = [(torch.randn(8, 6), torch.randn(8, 1)) for _ in range(3)]
    with am.track() as trace:
        model = nn.Sequential(MaskedLinear(6, 12, in_forward), nn.ReLU(), nn.Linear(12, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with contextlib.nullcontext() if in_forward else raises(TWICE):
            for x, y in data:
                opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()  # L:MASK_BACKWARD
                opt.step()
    return trace


def masked_in_forward() -> am.Trace:
    return _masked(in_forward=True)


def masked_in_init() -> am.Trace:
    return _masked(in_forward=False)


def _mlp():
    seed()
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(3)]
    return model, opt, data


def eval_under_inference_mode() -> am.Trace:
    # pytorch/examples imagenet/main.py validate() (there under torch.no_grad()), predictions
    # collected for an epoch-end accuracy, run under torch.inference_mode()
    model, opt, data = _mlp()
    with am.track() as trace:
        for _epoch in range(2):
            model.train()
            for x, y in data:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            model.eval()
            preds = []
            with torch.inference_mode():
                for x, _y in data:
                    preds.append(model(x))
            acc = (torch.cat(preds).argmax(1) == torch.cat([y for _x, y in data])).float().mean()
            print(f"{acc.item():.2f}")
    return trace


def eval_collect_with_grad() -> am.Trace:
    # the same validation run every epoch without no_grad, predictions kept for the accuracy
    # (discuss.pytorch.org "GPU memory grows during validation")
    model, opt, data = _mlp()
    with am.track() as trace:
        val_preds = []
        for _epoch in range(2):
            model.train()
            for x, y in data:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            model.eval()
            for x, _y in data:
                val_preds.append(model(x))  # L:EVAL_APPEND
        print(torch.cat(val_preds).argmax(1).shape)
    return trace


def hidden_retain_graph() -> am.Trace:
    # truncated BPTT written with retain_graph=True and gradients accumulated over the sequence,
    # the update after the sequence (discuss.pytorch.org "RNN memory grows with retain_graph")
    seed()
    cell, head = nn.RNNCell(4, 8), nn.Linear(8, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
    xs, ys = torch.randn(4, 2, 4), torch.randn(4, 2, 1)
    opt.zero_grad()
    with am.track() as trace:
        hidden = torch.zeros(2, 8)
        for x, y in zip(xs, ys, strict=True):
            hidden = cell(x, hidden)  # L:HR_HIDDEN
            loss = F.mse_loss(head(hidden), y)
            loss.backward(retain_graph=True)  # L:HR_BACKWARD
    opt.step()
    return trace


CORRECT = [
    Case(
        "masked-in-forward",
        "torch.nn.utils.prune pattern: the masked weight recomputed at each forward",
        masked_in_forward,
        line_of=line_of,
    ),
    Case(
        "eval-inference-mode",
        "pytorch/examples imagenet/main.py validate() under torch.inference_mode()",
        eval_under_inference_mode,
        line_of=line_of,
    ),
]

BROKEN = [
    Case(
        "masked-in-init",
        "discuss.pytorch.org masked weight computed once in __init__",
        masked_in_init,
        (
            Expect(
                "backward-through-freed",
                "MASK_BACKWARD",
                "loss",
                ("inside `forward`",),
                ("detach",),
            ),
        ),
        line_of=line_of,
    ),
    Case(
        "eval-collect-with-grad",
        "pytorch/examples imagenet/main.py validate() without no_grad, predictions kept",
        eval_collect_with_grad,
        (
            Expect(
                "kept-alive",
                "EVAL_APPEND",
                "val_preds",
                ("torch.no_grad()",),
                (".item()",),
            ),
        ),
        line_of=line_of,
    ),
    Case(
        "hidden-retain-graph",
        "discuss.pytorch.org truncated BPTT with retain_graph=True",
        hidden_retain_graph,
        (
            Expect("graph-growth", "HR_HIDDEN", "hidden", ("hidden = hidden.detach()",)),
            Expect("retained-graph", "HR_BACKWARD", "hidden", ("`hidden`",), ("`loss` is",)),
        ),
        line_of=line_of,
    ),
]
