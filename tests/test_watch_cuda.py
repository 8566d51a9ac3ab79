"""Watch mode on CUDA (issue 34): a real `torch.OutOfMemoryError` gets its post-mortem and reaches
the code unchanged, counted retained bytes match what the allocator frees, and a watched step
gives the same gradients and frees its graph at the same moment. Needs a GPU, so it never runs in
CI; run it on a CUDA machine with `PYTHONPATH=. python -m pytest tests/test_watch_cuda.py`."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import autograd_magic as am

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def conv_net() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    width = 3
    for out in (32, 64, 64):
        layers += [torch.nn.Conv2d(width, out, 3, padding=1), torch.nn.ReLU()]
        width = out
    model = torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.LazyLinear(10)).cuda()
    inputs = torch.randn(16, 3, 32, 32, device="cuda")
    model(inputs)  # materialize the lazy layer outside any watch
    return model, inputs


def test_a_cuda_out_of_memory_error_gets_a_post_mortem_and_reaches_the_code_unchanged():
    """GIVEN a loop on CUDA that keeps its losses, then asks for 4 TiB WHEN watched THEN the
    same torch.OutOfMemoryError reaches the code, and the post-mortem gives the kept bytes, the
    live roots, the line that saved them and `losses` as their holder."""
    model, inputs = conv_net()
    with pytest.raises(torch.OutOfMemoryError) as plain:
        torch.empty(2**42, dtype=torch.uint8, device="cuda")
    losses = []
    with pytest.raises(torch.OutOfMemoryError) as raised, am.watch(first=0) as w:
        for _ in range(3):
            loss = model(inputs).square().mean()
            loss.backward(retain_graph=True)
            losses.append(loss)
        torch.empty(2**42, dtype=torch.uint8, device="cuda")
    assert type(raised.value) is type(plain.value)
    assert str(raised.value).split(".")[0] == str(plain.value).split(".")[0]
    oom = w.trace.out_of_memory
    assert oom is not None and oom.live_roots == 3
    assert oom.retained_bytes > 3 * 16 * 32 * 32 * 32 * 4  # at least each step's first conv output
    assert oom.by_line and oom.by_line[0][1] > 0
    assert any("losses" in holder for holder in oom.holders)
    losses.clear()


def test_counted_retained_bytes_match_what_the_allocator_frees():
    """GIVEN a forward on CUDA whose graph is kept (no backward) WHEN a step ends under watch
    THEN the counted retained bytes equal the drop of torch.cuda.memory_allocated() when the
    loss, the graph's only root, is deleted."""
    model, inputs = conv_net()
    with am.watch(first=0) as w:
        loss = model(inputs).square().mean()
        w.step()
    counted = w.trace.steps[-1].retained_bytes
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    del loss
    torch.cuda.synchronize()
    drop = before - torch.cuda.memory_allocated()
    assert drop > 0
    assert counted == pytest.approx(drop, rel=0.01)


def _train(watched: bool) -> tuple[list[torch.Tensor], list[bool]]:
    model, inputs = conv_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    alive = []
    block = am.watch(first=1) if watched else _nothing()
    with block:
        for _ in range(4):
            optimizer.zero_grad(set_to_none=True)
            loss = model(inputs).square().mean()
            node = weakref.ref(loss.grad_fn)
            loss.backward()
            alive.append(node() is not None)
            optimizer.step()
            del loss
            alive.append(node() is not None)
    torch.cuda.synchronize()
    return [p.detach().cpu() for p in model.parameters()], alive


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_watched_cuda_loop_gives_the_same_weights_and_frees_graphs_at_the_same_moments():
    """GIVEN four SGD steps of a conv net on CUDA WHEN run watched (the first step captured in
    full, the rest counted) and unwatched THEN the weights are equal bit for bit and each loss's
    graph is freed at the same moment (gc off)."""
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    gc.disable()
    try:
        plain, plain_alive = _train(False)
        watched, watched_alive = _train(True)
    finally:
        gc.enable()
    assert watched_alive == plain_alive
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
