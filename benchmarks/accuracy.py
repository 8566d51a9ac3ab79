"""Workload 8: on CUDA, `retained_bytes` against what the allocator frees when the graph dies.

A conv net's forward runs under `track()`; with every activation held only by the graph, the
drop of `torch.cuda.memory_allocated()` when the loss is deleted is exactly the memory autograd
retained for backward, which `trace.retained_bytes` claims to count.
"""

from __future__ import annotations

import gc

import torch
from torch import nn

import autograd_magic
from benchmarks.results import ACCURACY_TARGET, Row, verdict
from benchmarks.workloads import gpu_name


def _net(blocks: int, width: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1)]
    for _ in range(blocks):
        layers += [nn.BatchNorm2d(width), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1)]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


def graph_bytes(blocks: int, width: int, batch: int, image: int) -> tuple[int, int]:
    """(retained_bytes the trace reports while the graph lives, allocator drop when it dies)."""
    torch.manual_seed(0)
    net = _net(blocks, width).cuda()
    inputs = torch.randn(batch, 3, image, image, device="cuda")
    gc.collect()
    torch.cuda.synchronize()
    with autograd_magic.track() as trace:
        loss = net(inputs).square().mean()
        torch.cuda.synchronize()
        retained = trace.retained_bytes
        before = torch.cuda.memory_allocated()
        del loss
        torch.cuda.synchronize()
        after = torch.cuda.memory_allocated()
    return retained, before - after


def measure(quick: bool) -> Row:
    """The relative gap between the two figures."""
    blocks, width, batch, image = (2, 8, 2, 16) if quick else (8, 64, 32, 64)
    retained, drop = graph_bytes(blocks, width, batch, image)
    gap = abs(retained - drop) / max(drop, 1)
    return Row(
        key="8",
        workload="retained_bytes accuracy (CUDA)",
        ours=(
            f"retained_bytes {retained / 2**20:.1f} MiB vs allocator drop "
            f"{drop / 2**20:.1f} MiB (gap {gap:.2%})"
        ),
        target=f"within {ACCURACY_TARGET:.0%} of the allocator",
        verdict=verdict(gap <= ACCURACY_TARGET),
        details=[
            f"{blocks} conv blocks of width {width} (BatchNorm, ReLU, 3x3 conv), batch {batch}, "
            f"{image}x{image} images, forward only, on {gpu_name()}; drop measured when the "
            "loss (the graph's only root) is deleted"
        ],
    )
