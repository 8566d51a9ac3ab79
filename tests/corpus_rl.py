# The loops keep their sources' own style (unused unpacked names, nested with-blocks).
# ruff: noqa: RUF059, SIM117
"""Reinforcement-learning corpus family (issue 35): a PPO rollout reused over several update
epochs, collected with and without its graph, and an A2C update from a fresh rollout."""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from corpus_base import TWICE, Case, Expect, raises, seed
from markers import marker_lines
from torch.distributions import Categorical

import autograd_magic as am

line_of = marker_lines(__file__)


class ActorCritic(nn.Module):
    """nikhilbarhate99/PPO-PyTorch PPO.py ActorCritic (discrete actions), shrunk."""

    def __init__(self) -> None:
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2), nn.Softmax(-1))
        self.critic = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def act(self, state):
        dist = Categorical(self.actor(state))
        action = dist.sample()
        return action, dist.log_prob(action)

    def evaluate(self, state, action):
        dist = Categorical(self.actor(state))
        return dist.log_prob(action), self.critic(state), dist.entropy()


class RolloutBuffer:
    def __init__(self) -> None:
        self.states: list[torch.Tensor] = []
        self.actions: list[torch.Tensor] = []
        self.logprobs: list[torch.Tensor] = []
        self.rewards: list[float] = []

    def clear(self) -> None:
        del self.states[:], self.actions[:], self.logprobs[:], self.rewards[:]


def _ppo(collect_without_grad: bool) -> am.Trace:
    # PPO.py select_action() and update(): K epochs over one rollout
    seed()
    policy, buffer = ActorCritic(), RolloutBuffer()
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-4)

    def select_action(state):
        if collect_without_grad:
            with torch.no_grad():
                action, action_logprob = policy.act(state)
        else:  # the rollout keeps each log-probability's graph
            action, action_logprob = policy.act(state)
        buffer.states.append(state)
        buffer.actions.append(action)
        buffer.logprobs.append(action_logprob)  # L:PPO_STORE
        return action.item()

    def update():
        rewards = torch.tensor(buffer.rewards)
        rewards = (rewards - rewards.mean()) / (rewards.std() + 1e-7)
        old_states = torch.stack(buffer.states)
        old_actions = torch.stack(buffer.actions)
        old_logprobs = torch.stack(buffer.logprobs)
        for _ in range(3):
            logprobs, state_values, dist_entropy = policy.evaluate(old_states, old_actions)
            ratios = torch.exp(logprobs - old_logprobs)
            advantages = rewards - state_values.squeeze().detach()
            surr1 = ratios * advantages
            surr2 = torch.clamp(ratios, 0.8, 1.2) * advantages
            loss = -torch.min(surr1, surr2) + 0.5 * F.mse_loss(state_values.squeeze(), rewards)
            optimizer.zero_grad()
            loss.mean().backward()  # L:PPO_BACKWARD
            optimizer.step()
        buffer.clear()

    with am.track() as trace:
        with contextlib.nullcontext() if collect_without_grad else raises(TWICE):
            for _episode in range(2):
                for _t in range(6):
                    action = select_action(torch.randn(4))
                    buffer.rewards.append(float(action))
                update()  # L:PPO_UPDATE
    return trace


def ppo() -> am.Trace:
    return _ppo(collect_without_grad=True)


def ppo_rollout_with_graph() -> am.Trace:
    return _ppo(collect_without_grad=False)


def a2c() -> am.Trace:
    # higgsfield/RL-Adventure-2 1.actor-critic.ipynb (n-step A2C update from a fresh rollout),
    # with the bootstrap value under no_grad as ikostrikov/pytorch-a2c-ppo-acktr-gail does
    seed()
    model = ActorCritic()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    with am.track() as trace:
        state = torch.randn(4)
        for _update in range(3):
            log_probs, values, rewards = [], [], []
            entropy = 0
            for _step in range(5):
                dist = Categorical(model.actor(state))
                value = model.critic(state)
                action = dist.sample()
                log_probs.append(dist.log_prob(action).unsqueeze(0))
                entropy += dist.entropy().mean()
                values.append(value)
                rewards.append(torch.rand(1))
                state = torch.randn(4)
            with torch.no_grad():
                next_value = model.critic(state)
            R, returns = next_value, []
            for step in reversed(range(len(rewards))):
                R = rewards[step] + 0.99 * R
                returns.insert(0, R)
            log_probs = torch.cat(log_probs)
            returns = torch.cat(returns).detach()
            values = torch.cat(values)
            advantage = returns - values
            actor_loss = -(log_probs * advantage.detach()).mean()
            critic_loss = advantage.pow(2).mean()
            loss = actor_loss + 0.5 * critic_loss - 0.001 * entropy
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return trace


CORRECT = [
    Case(
        "ppo",
        "nikhilbarhate99/PPO-PyTorch PPO.py (rollout under no_grad, K epochs over it)",
        ppo,
        line_of=line_of,
    ),
    Case(
        "a2c",
        "higgsfield/RL-Adventure-2 1.actor-critic.ipynb n-step A2C update",
        a2c,
        line_of=line_of,
    ),
]

BROKEN = [
    Case(
        "ppo-rollout-with-graph",
        "nikhilbarhate99/PPO-PyTorch PPO.py with select_action's torch.no_grad() removed",
        ppo_rollout_with_graph,
        (
            Expect(
                "backward-through-freed",
                "PPO_BACKWARD",
                None,
                ("no_grad", "buffer.logprobs"),
                ("del ", "empty it"),
            ),
        ),
        line_of=line_of,
    ),
]
