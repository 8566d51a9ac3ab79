"""Workload 8: on CUDA, `retained_bytes` against what the allocator frees when the graph dies.

Each case builds a graph inside `track()` and keeps only its root (the loss). When the block
ends the trace has read who holds each saved storage, so `trace.retained_bytes` claims the bytes
that only the graph holds; deleting the root then frees exactly those, and the drop of
`torch.cuda.memory_allocated()` is the independent figure. The cases are the ones issue 21
measured: a conv net (exact then), BERT-base and GPT-2 small from random configs (dropout on),
BERT-base under bf16 autocast, and a conv net step under fp16 autocast.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

import autograd_magic
from benchmarks.results import ACCURACY_TARGET, Row, verdict
from benchmarks.workloads import gpu_name

Forward = Callable[[], torch.Tensor]  # builds the graph, returns its only root


@dataclass(frozen=True)
class Case:
    """One graph to measure: what it is and how to build its forward on CUDA."""

    name: str
    build: Callable[[bool], Forward | None]  # (quick) -> forward, None when it cannot run


def _conv_net(blocks: int, width: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1)]
    for _ in range(blocks):
        layers += [nn.BatchNorm2d(width), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1)]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


def _conv(autocast: bool) -> Callable[[bool], Forward]:
    def build(quick: bool) -> Forward:
        blocks, width, batch, image = (2, 8, 2, 16) if quick else (8, 64, 32, 64)
        net = _conv_net(blocks, width).cuda()
        inputs = torch.randn(batch, 3, image, image, device="cuda")

        def forward() -> torch.Tensor:
            with torch.autocast("cuda", dtype=torch.float16, enabled=autocast):
                out = net(inputs)
            return out.float().square().mean()

        return forward

    return build


def _hugging_face(kind: str, autocast: bool = False) -> Callable[[bool], Forward | None]:
    def build(quick: bool) -> Forward | None:
        try:
            import transformers
        except ImportError:
            return None
        if kind == "bert":
            config = transformers.BertConfig(
                **(
                    {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2}
                    if quick
                    else {}
                )
            )
            model = transformers.BertForMaskedLM(config)
            batch, tokens = (2, 16) if quick else (16, 128)
        else:
            config = transformers.GPT2Config(
                **({"n_layer": 2, "n_embd": 64, "n_head": 2} if quick else {})
            )
            model = transformers.GPT2LMHeadModel(config)
            batch, tokens = (2, 16) if quick else (8, 256)
        model = model.cuda().train()  # dropout on: its masks are saved
        ids = torch.randint(0, config.vocab_size, (batch, tokens), device="cuda")

        def forward() -> torch.Tensor:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=ids, labels=ids).loss
            return loss.float()

        return forward

    return build


CASES = [
    Case("conv net", _conv(autocast=False)),
    Case("BERT-base forward, dropout on", _hugging_face("bert")),
    Case("GPT-2 small forward, dropout on", _hugging_face("gpt2")),
    Case("BERT-base forward, bf16 autocast", _hugging_face("bert", autocast=True)),
    Case("conv net step, fp16 autocast", _conv(autocast=True)),
]


def graph_bytes(forward: Forward) -> tuple[int, int]:
    """(retained_bytes the trace reports at the block's end, allocator drop when the graph's
    only root is deleted)."""
    gc.collect()
    torch.cuda.synchronize()
    with autograd_magic.track() as trace:
        loss = forward()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    del loss
    torch.cuda.synchronize()
    return trace.retained_bytes, before - torch.cuda.memory_allocated()


def measure_case(case: Case, quick: bool) -> tuple[int, int] | None:
    """(retained, drop) for one case, or None when it cannot run (transformers missing)."""
    torch.manual_seed(0)
    forward = case.build(quick)
    return None if forward is None else graph_bytes(forward)


def measure(quick: bool) -> Row:
    """The largest relative gap between the two figures over the cases, each case detailed."""
    details, gaps = [], []
    for case in CASES:
        result = measure_case(case, quick)
        if result is None:
            details.append(f"{case.name}: skipped (transformers not installed)")
            continue
        retained, drop = result
        gap = abs(retained - drop) / max(drop, 1)
        gaps.append(gap)
        details.append(
            f"{case.name}: retained_bytes {retained / 2**20:.1f} MiB vs allocator drop "
            f"{drop / 2**20:.1f} MiB (gap {gap:.2%})"
        )
    worst = max(gaps, default=0.0)
    return Row(
        key="8",
        workload="retained_bytes accuracy (CUDA)",
        ours=f"largest gap {worst:.2%} over {len(gaps)} graphs",
        target=f"within {ACCURACY_TARGET:.0%} of the allocator",
        verdict=verdict(bool(gaps) and worst <= ACCURACY_TARGET),
        details=[
            *details,
            f"on {gpu_name()}; each graph built inside track(), only its loss kept; the drop is "
            "measured when the loss (the graph's only root) is deleted after the block",
        ],
    )
