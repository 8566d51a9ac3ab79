# The loops keep their sources' own style (zip without strict=, nested with-blocks).
# ruff: noqa: B905, SIM117
"""Corpus family of losses made from gradients (issue 35): a GAN's R1 penalty with and without
create_graph=True, and MAML's fast weights started from the parameters for each task or carried
from one task to the next."""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from corpus_base import TWICE, Case, Expect, raises, seed
from markers import marker_lines

import autograd_magic as am

line_of = marker_lines(__file__)


def _r1(create_graph: bool) -> am.Trace:
    # rosinality/stylegan2-pytorch train.py: d_r1_loss() and the lazy R1 step (d_reg_every)
    seed()
    discriminator = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    d_optim = torch.optim.Adam(discriminator.parameters(), lr=2e-3)

    def d_r1_loss(real_pred, real_img):
        (grad_real,) = torch.autograd.grad(
            outputs=real_pred.sum(), inputs=real_img, create_graph=create_graph
        )  # L:R1_GRAD
        return grad_real.pow(2).reshape(grad_real.shape[0], -1).sum(1).mean()

    with am.track() as trace:
        with contextlib.nullcontext() if create_graph else raises(TWICE):
            for _i in range(3):
                real_img = torch.randn(8, 6)
                real_img.requires_grad = True
                real_pred = discriminator(real_img)  # L:R1_PRED
                r1_loss = d_r1_loss(real_pred, real_img)  # L:R1_CALL
                discriminator.zero_grad()
                (10 / 2 * r1_loss * 16 + 0 * real_pred[0]).backward()  # L:R1_BACKWARD
                d_optim.step()
    return trace


def r1_penalty() -> am.Trace:
    return _r1(create_graph=True)


def r1_without_create_graph() -> am.Trace:
    return _r1(create_graph=False)


def _net(x, weights):
    return F.relu(x @ weights[0] + weights[1]) @ weights[2] + weights[3]


def _meta_params():
    seed()
    w1, b1 = torch.randn(4, 16) * 0.3, torch.zeros(16)
    w2, b2 = torch.randn(16, 1) * 0.3, torch.zeros(1)
    params = [p.requires_grad_() for p in (w1, b1, w2, b2)]
    return params, torch.optim.Adam(params, lr=1e-3)


def maml_inner_steps() -> am.Trace:
    # dragen1860/MAML-Pytorch meta.py forward(): each task starts its fast weights from the
    # parameters, takes several inner steps, and the query losses are summed for one update;
    # second-order (create_graph=True) as tristandeleu/pytorch-maml's gradient_update_parameters
    params, meta_optim = _meta_params()
    with am.track() as trace:
        for _step in range(2):
            losses_q = 0
            for _task in range(2):
                x_spt, y_spt, x_qry, y_qry = (
                    torch.randn(5, 4),
                    torch.randn(5, 1),
                    *(
                        torch.randn(5, 4),
                        torch.randn(5, 1),
                    ),
                )
                fast_weights = list(params)
                for _k in range(2):
                    loss = F.mse_loss(_net(x_spt, fast_weights), y_spt)
                    grad = torch.autograd.grad(loss, fast_weights, create_graph=True)
                    fast_weights = [w - 0.01 * g for g, w in zip(grad, fast_weights)]
                losses_q = losses_q + F.mse_loss(_net(x_qry, fast_weights), y_qry)
            meta_optim.zero_grad()
            (losses_q / 2).backward()
            meta_optim.step()
    return trace


def maml_fast_weights_carried() -> am.Trace:
    # the same with the fast weights made once, before the task loop, and carried from one
    # task into the next (discuss.pytorch.org "MAML: backward through the graph a second time")
    params, meta_optim = _meta_params()
    with am.track() as trace:
        fast_weights = list(params)
        with raises(TWICE):
            for _task in range(3):
                x_spt, y_spt = torch.randn(5, 4), torch.randn(5, 1)
                x_qry, y_qry = torch.randn(5, 4), torch.randn(5, 1)
                loss = F.mse_loss(_net(x_spt, fast_weights), y_spt)
                grad = torch.autograd.grad(loss, fast_weights, create_graph=True)
                fast_weights = [w - 0.01 * g for g, w in zip(grad, fast_weights)]  # L:MAML_FAST
                loss_q = F.mse_loss(_net(x_qry, fast_weights), y_qry)
                meta_optim.zero_grad()
                loss_q.backward()  # L:MAML_BACKWARD
                meta_optim.step()
    return trace


CORRECT = [
    Case(
        "r1-penalty",
        "rosinality/stylegan2-pytorch train.py d_r1_loss (create_graph=True)",
        r1_penalty,
        line_of=line_of,
    ),
    Case(
        "maml-inner-steps",
        "dragen1860/MAML-Pytorch meta.py forward() (fast weights restarted from the parameters "
        "per task, inner steps, summed query losses), create_graph=True as tristandeleu/"
        "pytorch-maml",
        maml_inner_steps,
        line_of=line_of,
    ),
]

BROKEN = [
    Case(
        "r1-without-create-graph",
        "rosinality/stylegan2-pytorch train.py d_r1_loss with create_graph=True left out",
        r1_without_create_graph,
        (
            Expect(
                "backward-through-freed",
                "R1_BACKWARD",
                None,
                ("create_graph=True",),
                ("built once", "reused by every later backward"),
            ),
        ),
        line_of=line_of,
    ),
    Case(
        "maml-fast-weights-carried",
        "dragen1860/MAML-Pytorch meta.py with fast_weights carried across tasks",
        maml_fast_weights_carried,
        (
            Expect(
                "graph-growth",
                "MAML_FAST",
                "fast_weights",
                ("fast_weights = list(", "meta-gradient"),
                ("detach()",),
            ),
            Expect(
                "backward-through-freed",
                "MAML_BACKWARD",
                "loss_q",
                ("fast_weights = list(",),
                ("detach()",),
            ),
        ),
        line_of=line_of,
    ),
]
