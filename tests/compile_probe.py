"""Runs torch.compile cases in this process, tracked or not, and prints one JSON digest.

`python compile_probe.py BACKEND tracked|untracked CASE...` prints, per case: a sha256 of the
values and gradients, the number of graphs the backend compiled, Dynamo's graph-break reasons,
warnings, printed text and the exception raised. `tests/test_compile.py` runs it once per side,
each in a fresh process, and compares the two digests.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch._dynamo
import torch._dynamo.testing
import torch._dynamo.utils

import autograd_magic

CASES: dict[str, Callable[[Callable[..., Any]], Any]] = {}
# Cases that open their own blocks (`BLOCK()`, a no-op untracked), not run inside one.
OWN_BLOCKS: set[str] = set()
BLOCK: Callable[[], Any] = contextlib.nullcontext


def case(fn: Callable[[Callable[..., Any]], Any]) -> Callable[[Callable[..., Any]], Any]:
    """Register a case: it gets `compile` (torch.compile bound to the backend) and returns
    what to digest (tensors, arrays, numbers, nested in lists)."""
    CASES[fn.__name__] = fn
    return fn


def _inputs(*shape: int, grad: bool = False) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(*shape, requires_grad=grad)


@case
def print_in_loop(compile):
    @compile
    def f(x):
        for i in range(3):
            print("step", i)
            x = x.cos()
        return x.exp().sum()

    return f(torch.ones(3))


@case
def print_break(compile):
    @compile
    def f(x):
        y = x.sin() * 2
        print("between")
        return (y.cos() + 1).sum()

    return f(_inputs(4))


@case
def item_branch(compile):
    @compile
    def f(x):
        if x.sum().item() > 0:
            return x.sin() + 1
        return x.cos() - 1

    return [f(_inputs(5)), f(-_inputs(5).abs())]


@case
def loop_with_break(compile):
    @compile
    def f(x):
        for _ in range(6):
            x = x * 1.5
            if x.abs().sum() > 20:
                break
        return x

    return f(_inputs(4))


@case
def fullgraph_module(compile):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    @compile(fullgraph=True)
    def f(x):
        return model(x).tanh().sum()

    x = _inputs(3, 4)
    loss = f(x)
    loss.backward()
    return [loss, [p.grad for p in model.parameters()]]


@case
def sequential(compile):
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    compiled = compile(model)
    x = _inputs(5, 4)
    out = compiled(x)
    out.sum().backward()
    return [out, [p.grad for p in model.parameters()]]


@case
def module_with_hooks(compile):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    model[0].register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    model[0].register_forward_hook(lambda m, args, out: out + 1)

    @compile
    def f(x):
        return model(x).sum()

    loss = f(_inputs(2, 4))
    loss.backward()
    return [loss, model[0].weight.grad]


@case
def from_numpy_inside(compile):
    @compile
    def f(a):
        t = torch.from_numpy(a)
        return (t * 2 + 1).sum()

    return f(np.arange(6, dtype=np.float32))


@case
def numpy_inside(compile):
    @compile
    def f(x):
        a = x.numpy()
        return torch.from_numpy(np.add(np.sin(a), 1)) * 2

    return f(_inputs(5))


@case
def numpy_operators(compile):
    @compile
    def f(x):
        return torch.from_numpy(x.numpy() * 2 + 1)

    return f(_inputs(5))


@case
def warns_inside(compile):
    @compile
    def f(x):
        y = x.exp()
        warnings.warn("careful", UserWarning, stacklevel=2)
        return y.log1p().sum()

    return f(_inputs(4))


@case
def compiled_module_hooks_of_its_own(compile):
    torch.manual_seed(4)
    model = torch.nn.Linear(3, 3)
    model.register_forward_hook(lambda m, args, out: out * 2)
    compiled = compile(model)
    out = compiled(_inputs(2, 3))
    out.sum().backward()
    return [out, model.weight.grad]


@case
def backward_through(compile):
    @compile
    def f(x, w):
        return (x @ w).relu().pow(2).mean()

    x, w = _inputs(3, 4), _inputs(4, 2, grad=True)
    loss = f(x, w)
    loss.backward()
    return [loss, w.grad]


@case
def dynamic_shapes(compile):
    @compile(dynamic=True)
    def f(x):
        return (x.sin() * x.shape[0]).sum()

    return [f(_inputs(3)), f(_inputs(7)), f(_inputs(11))]


@case
def recompile_new_shape(compile):
    @compile
    def f(x):
        return x.softmax(0) * 3

    return [f(_inputs(3)), f(_inputs(6, 2))]


@case
def across_blocks(compile):
    """A compiled model called before, in, between and after several blocks."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = compile(model)
    x = _inputs(2, 4)
    outs = [compiled(x)]
    for _ in range(10):
        with BLOCK():
            outs.append(compiled(x))
        outs.append(compiled(x))
    return outs


OWN_BLOCKS.add("across_blocks")


def _digest(value: Any) -> str:
    sha = hashlib.sha256()

    def feed(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            item = item.detach().contiguous()
            sha.update(f"{item.dtype}{tuple(item.shape)}{item.requires_grad}".encode())
            sha.update(item.numpy().tobytes())
        elif isinstance(item, np.ndarray):
            sha.update(f"{item.dtype}{item.shape}".encode() + item.tobytes())
        elif isinstance(item, (list, tuple)):
            sha.update(b"[")
            for sub in item:
                feed(sub)
            sha.update(b"]")
        else:
            sha.update(repr(item).encode())

    feed(value)
    return sha.hexdigest()[:16]


def run_case(name: str, backend: str, tracked: bool) -> dict[str, Any]:
    """Run one case from a clean Dynamo state; its digest."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)

    def compile(fn=None, **options):
        if fn is None:
            return lambda f: torch.compile(f, backend=counter, **options)
        return torch.compile(fn, backend=counter, **options)

    out: dict[str, Any] = {}
    printed = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(printed):
        warnings.simplefilter("always")
        try:
            if tracked and name not in OWN_BLOCKS:
                with autograd_magic.track():
                    value = CASES[name](compile)
            else:
                value = CASES[name](compile)
            out["value"] = _digest(value)
        except Exception as error:
            out["error"] = f"{type(error).__name__}: {str(error)[:300]}"
    out["graphs"] = counter.frame_count
    out["ops"] = counter.op_count
    out["breaks"] = dict(sorted(torch._dynamo.utils.counters["graph_break"].items()))
    out["warnings"] = [
        f"{w.category.__name__}: {str(w.message)[:200]} @ {os.path.basename(w.filename)}:{w.lineno}"
        for w in caught
    ]
    out["printed"] = printed.getvalue()
    return out


def main(argv: list[str]) -> None:
    global BLOCK
    backend, side, *names = argv
    if side == "tracked":
        BLOCK = autograd_magic.track
    digest = {name: run_case(name, backend, side == "tracked") for name in names or CASES}
    print(json.dumps(digest))


if __name__ == "__main__":
    main(sys.argv[1:])
