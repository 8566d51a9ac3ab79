"""A user's first run on their torch: a small training loop under `track()`, then the report.

Exits non-zero when the block raises, the weights differ from the same loop untracked, or the
trace misses what the loop plainly does (graphs, saved tensors, backward calls, the kept-alive
running total). Run by run_matrix.py in each cell, against the installed package.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import autograd_magic as am


def train(steps: int) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    total_loss = torch.zeros(())
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        total_loss = total_loss + loss  # keeps every step's graph alive: a finding
    return model, total_loss


def main() -> int:
    print(f"autograd_magic from {am.__file__}; torch {torch.__version__}; Python {sys.version}")
    plain_model, _ = train(5)
    with am.track() as trace:
        model, total_loss = train(5)
    same = all(
        torch.equal(a, b) for a, b in zip(plain_model.parameters(), model.parameters(), strict=True)
    )
    snapshot = trace.snapshot()
    am.show(trace)  # outside IPython: the text report
    checks = {
        "same weights as untracked": same,
        "nodes recorded": len(trace.nodes) > 0,
        "saved tensors recorded": len(trace.buffers) > 0,
        "5 backward calls": len(trace.backward_calls) == 5,
        "graphs still alive (total_loss)": snapshot.live_nodes > 0,
        "a finding": len(trace.findings) > 0,
    }
    del total_loss
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
