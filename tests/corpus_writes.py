# The loops keep their sources' own style (zip without strict=, the deprecated add_(alpha,
# other) overload), so a user's code is what the findings see.
# ruff: noqa: B905
"""Corpus family (issue 35): writes to parameters and shared storage in code nobody here
wrote. Target-network soft updates (through `state_dict()` or `.data`), pruned and masked
parameters and manual SGD updates done right (no finding), and manual updates through `.data`
under a graph a later backward still walks (one finding per update line)."""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.utils.prune as prune
from corpus_base import Case, Expect, seed
from markers import marker_lines

import autograd_magic as am

line_of = marker_lines(__file__)


# ===== target networks ===========================================================================
def dqn_models():
    seed()
    policy_net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    target_net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    target_net.load_state_dict(policy_net.state_dict())
    return policy_net, target_net


def dqn_soft_update() -> am.Trace:
    # pytorch/tutorials intermediate_source/reinforcement_q_learning.py: optimize_model() and
    # the soft update of the target network's weights through state_dict()
    policy_net, target_net = dqn_models()
    optimizer = torch.optim.AdamW(policy_net.parameters(), lr=1e-3, amsgrad=True)
    TAU, GAMMA = 0.005, 0.99
    batches = [
        (torch.randn(8, 4), torch.randint(0, 2, (8, 1)), torch.randn(8), torch.randn(8, 4))
        for _ in range(3)
    ]
    with am.track() as trace:
        for state_batch, action_batch, reward_batch, next_states in batches:
            state_action_values = policy_net(state_batch).gather(1, action_batch)
            with torch.no_grad():
                next_state_values = target_net(next_states).max(1).values
            expected_state_action_values = (next_state_values * GAMMA) + reward_batch
            criterion = nn.SmoothL1Loss()
            loss = criterion(state_action_values, expected_state_action_values.unsqueeze(1))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
            optimizer.step()
            target_net_state_dict = target_net.state_dict()
            policy_net_state_dict = policy_net.state_dict()
            for key in policy_net_state_dict:
                target_net_state_dict[key] = policy_net_state_dict[
                    key
                ] * TAU + target_net_state_dict[key] * (1 - TAU)
            target_net.load_state_dict(target_net_state_dict)
    return trace


def soft_update(target, source, tau):
    # ghliu/pytorch-ddpg util.py
    for target_param, param in zip(target.parameters(), source.parameters()):
        target_param.data.copy_(target_param.data * (1.0 - tau) + param.data * tau)


def ddpg_soft_update() -> am.Trace:
    # ghliu/pytorch-ddpg ddpg.py update_policy(): critic, then actor, then soft updates
    seed()
    actor = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1), nn.Tanh())
    critic = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    actor_target = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1), nn.Tanh())
    critic_target = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    actor_target.load_state_dict(actor.state_dict())
    critic_target.load_state_dict(critic.state_dict())
    actor_optim = torch.optim.Adam(actor.parameters(), lr=1e-4)
    critic_optim = torch.optim.Adam(critic.parameters(), lr=1e-3)
    batches = [(torch.randn(8, 3), torch.randn(8, 1), torch.randn(8, 1), torch.randn(8, 3))] * 3
    with am.track() as trace:
        for state_batch, action_batch, reward_batch, next_state_batch in batches:
            with torch.no_grad():
                next_q_values = critic_target(
                    torch.cat([next_state_batch, actor_target(next_state_batch)], 1)
                )
            target_q_batch = reward_batch + 0.99 * next_q_values
            critic.zero_grad()
            q_batch = critic(torch.cat([state_batch, action_batch], 1))
            value_loss = F.mse_loss(q_batch, target_q_batch)
            value_loss.backward()
            critic_optim.step()
            actor.zero_grad()
            policy_loss = -critic(torch.cat([state_batch, actor(state_batch)], 1)).mean()
            policy_loss.backward()
            actor_optim.step()
            soft_update(actor_target, actor, 0.01)
            soft_update(critic_target, critic, 0.01)
    return trace


# ===== pruned and masked parameters ==============================================================
def pruned_training() -> am.Trace:
    # pytorch/tutorials intermediate_source/pruning_tutorial.py: l1_unstructured and
    # global_unstructured masks (forward pre-hooks), trained, then made permanent
    seed()
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    prune.l1_unstructured(model[0], name="weight", amount=0.3)
    prune.global_unstructured(
        [(model[2], "weight"), (model[2], "bias")],
        pruning_method=prune.L1Unstructured,
        amount=0.2,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(3)]
    with am.track() as trace:
        for x, y in data:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        prune.remove(model[0], "weight")
        print(float((model[0].weight == 0).float().mean()))
    return trace


def lottery_ticket_masked_grads() -> am.Trace:
    # rahulvigneswaran/Lottery-Ticket-Hypothesis-in-Pytorch main.py train(): pruned weights'
    # gradients zeroed through NumPy and `.data` before optimizer.step()
    seed()
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_((p.abs() > 0.1).float())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    EPS = 1e-6
    data = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(3)]
    with am.track() as trace:
        model.train()
        for imgs, targets in data:
            optimizer.zero_grad()
            output = model(imgs)
            train_loss = criterion(output, targets)
            train_loss.backward()
            for name, p in model.named_parameters():
                if "weight" in name:
                    tensor = p.data.cpu().numpy()
                    grad_tensor = p.grad.data.cpu().numpy()
                    grad_tensor = np.where(np.abs(tensor) < EPS, 0, grad_tensor)
                    p.grad.data = torch.from_numpy(grad_tensor)
            optimizer.step()
    return trace


# ===== manual SGD updates ========================================================================
def nn_tutorial_manual_sgd() -> am.Trace:
    # pytorch/tutorials beginner_source/nn_tutorial.py: the update under torch.no_grad()
    seed()
    weights = (torch.randn(6, 3) / 6**0.5).requires_grad_()
    bias = torch.zeros(3, requires_grad=True)
    data = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(3)]
    lr = 0.5
    with am.track() as trace:
        for xb, yb in data:
            pred = F.log_softmax(xb @ weights + bias, dim=1)
            loss = F.nll_loss(pred, yb)
            loss.backward()
            with torch.no_grad():
                weights -= weights.grad * lr
                bias -= bias.grad * lr
                weights.grad.zero_()
                bias.grad.zero_()
    return trace


class LSTMLM(nn.Module):
    """pytorch/examples word_language_model/model.py RNNModel, 2-layer LSTM, shrunk."""

    def __init__(self, ntoken: int = 20, ninp: int = 8, nhid: int = 8) -> None:
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 2)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.encoder(input), hidden)
        return F.log_softmax(self.decoder(output).view(-1, 20), dim=1), hidden

    def init_hidden(self, bsz: int):
        weight = next(self.parameters())
        return (weight.new_zeros(2, bsz, 8), weight.new_zeros(2, bsz, 8))


def word_lm_old_sgd_no_detach() -> am.Trace:
    # pytorch/examples word_language_model/main.py (2017): p.data.add_(-lr, p.grad.data), with
    # repackage_hidden left out and retain_graph=True to silence the error it then raises
    seed()
    model = LSTMLM()
    train_data = torch.randint(0, 20, (7, 2))
    lr = 20
    with am.track() as trace, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the deprecated add_ overload
        hidden = model.init_hidden(2)
        for i in range(0, 6, 2):
            output, hidden = model(train_data[i : i + 2], hidden)  # L:OLDSGD_HIDDEN
            loss = F.nll_loss(output, train_data[i + 1 : i + 3].reshape(-1))
            model.zero_grad()
            loss.backward(retain_graph=True)  # L:OLDSGD_BACKWARD
            for p in model.parameters():
                p.data.add_(-lr, p.grad.data)  # L:OLDSGD_UPDATE
    return trace


def actor_critic_shared_trunk() -> am.Trace:
    # discuss.pytorch.org actor-critic with a shared trunk: the actor's manual update through
    # `.data` between the actor's and the critic's backward through one graph
    seed()
    trunk = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
    actor, critic = nn.Linear(16, 2), nn.Linear(16, 1)
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,)), torch.randn(8, 1)) for _ in range(3)]
    lr = 0.01
    with am.track() as trace:
        for state, action, ret in data:
            h = trunk(state)  # L:AC_TRUNK
            log_prob = F.log_softmax(actor(h), 1).gather(1, action[:, None])
            value = critic(h)
            actor_loss = -(log_prob * (ret - value.detach())).mean()
            actor_loss.backward(retain_graph=True)  # L:AC_ACTOR_BACKWARD
            for p in trunk.parameters():
                p.data.add_(p.grad, alpha=-lr)  # L:AC_UPDATE
                p.grad = None
            critic_loss = F.mse_loss(value, ret)
            critic_loss.backward()
            for p in [*trunk.parameters(), *critic.parameters()]:
                p.data.add_(p.grad, alpha=-lr)
                p.grad = None
    return trace


CORRECT = [
    Case(
        "dqn-soft-update",
        "pytorch/tutorials intermediate_source/reinforcement_q_learning.py (soft update)",
        dqn_soft_update,
        line_of=line_of,
    ),
    Case(
        "ddpg-soft-update",
        "ghliu/pytorch-ddpg ddpg.py + util.py soft_update (target_param.data.copy_)",
        ddpg_soft_update,
        line_of=line_of,
    ),
    Case(
        "pruned-training",
        "pytorch/tutorials intermediate_source/pruning_tutorial.py",
        pruned_training,
        line_of=line_of,
    ),
    Case(
        "lottery-ticket-masked-grads",
        "rahulvigneswaran/Lottery-Ticket-Hypothesis-in-Pytorch main.py train()",
        lottery_ticket_masked_grads,
        line_of=line_of,
    ),
    Case(
        "nn-tutorial-manual-sgd",
        "pytorch/tutorials beginner_source/nn_tutorial.py (update under torch.no_grad)",
        nn_tutorial_manual_sgd,
        line_of=line_of,
    ),
]

BROKEN = [
    Case(
        "word-lm-old-sgd-no-detach",
        "pytorch/examples word_language_model/main.py (2017 p.data.add_) without repackage_hidden",
        word_lm_old_sgd_no_detach,
        (
            Expect(
                "graph-growth",
                "OLDSGD_HIDDEN",
                "hidden",
                ("hidden = tuple(t.detach() for t in hidden)",),
                ("optimizer's updates",),  # no optimizer: the update's own finding says it
            ),
            Expect("retained-graph", "OLDSGD_BACKWARD", "hidden", ("drop retain_graph=True",)),
            Expect(
                "data-bypass",
                "OLDSGD_UPDATE",
                "model",
                ("9 parameters of `model`", "Detaching `hidden`", "p.add_(p.grad, alpha=-lr)"),
                ("before the forward pass",),
            ),
        ),
        line_of=line_of,
    ),
    Case(
        "actor-critic-shared-trunk",
        "discuss.pytorch.org actor-critic, trunk updated through .data between two backwards",
        actor_critic_shared_trunk,
        (
            Expect("retained-graph", "AC_ACTOR_BACKWARD", "actor_loss", ("sum them",)),
            Expect(
                "data-bypass",
                "AC_UPDATE",
                "trunk.2.weight",
                ("after the last backward", "torch.no_grad()", "p.add_(p.grad, alpha=-lr)"),
                ("before the forward pass",),
            ),
        ),
        line_of=line_of,
    ),
]
