"""Models whose saved tensors include memory made without grad (RNN workspaces, dropout masks,
normalization statistics, masks built in `forward`, autocast's casts), each run as a case that
returns its namespace: `retained_truth.measure` and `track()` must agree on what graphs hold."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


def lstm_outputs_kept() -> dict[str, Any]:
    """Outputs of a 2-layer LSTM kept without `no_grad` (the workspace is uint8, no grad)."""
    torch.manual_seed(0)
    lstm = nn.LSTM(32, 64, num_layers=2)
    outs = []
    for _ in range(30):
        x = torch.randn(10, 8, 32)
        out, _ = lstm(x)
        outs.append(out)
    return locals()


def gru_state_carried() -> dict[str, Any]:
    """A GRU's hidden state carried across steps without detach: one graph grows."""
    torch.manual_seed(0)
    gru = nn.GRU(16, 32, num_layers=2)
    h = None
    for _ in range(12):
        out, h = gru(torch.randn(6, 4, 16), h)
    return locals()


def transformer_half_backward() -> dict[str, Any]:
    """A transformer encoder (dropout, LayerNorm) in training mode; every other loss is
    backpropagated, all are kept."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.1)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    losses = []
    for step in range(6):
        loss = model(torch.randn(12, 4, 64)).pow(2).mean()
        if step % 2 == 0:
            loss.backward()
        losses.append(loss)
    return locals()


def cnn_batchnorm_predictions() -> dict[str, Any]:
    """A CNN with BatchNorm and dropout whose predictions are kept."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 16 * 16, 10),
    )
    preds = []
    for _ in range(8):
        preds.append(model(torch.randn(4, 3, 16, 16)))
    return locals()


class MaskedAttention(nn.Module):
    """Builds a causal mask and position indices inside `forward` each call."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.pos = nn.Embedding(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        positions = torch.arange(t).expand(x.shape[0], t)
        q, k, v = self.qkv(x + self.pos(positions)).chunk(3, dim=-1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        scores = (q @ k.transpose(-2, -1)).masked_fill(mask, float("-inf"))
        return F.softmax(scores, dim=-1) @ v


def masks_built_in_forward() -> dict[str, Any]:
    """Outputs of a model that builds masks and indices in `forward`, kept."""
    torch.manual_seed(0)
    model = MaskedAttention()
    outs = []
    for _ in range(10):
        outs.append(model(torch.randn(4, 48, 32)).sum())
    return locals()


def mlp_cpu_autocast() -> dict[str, Any]:
    """An MLP step under CPU bf16 autocast (the casts of the weights are saved), losses kept."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    losses = []
    for _ in range(6):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = mlp(torch.randn(32, 64))
        losses.append(out.float().pow(2).mean())
    return locals()


CASES = [
    lstm_outputs_kept,
    gru_state_carried,
    transformer_half_backward,
    cnn_batchnorm_predictions,
    masks_built_in_forward,
    mlp_cpu_autocast,
]
