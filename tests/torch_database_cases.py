"""The cases of PyTorch's test databases, as bodies for `torch_databases.run_case`.

Each database yields `(case_id, body)` in a fixed order. Sample inputs are built before a body
runs (seeded per group of cases, outside any block); the body builds the module, parameters or
optimizer, calls it and stores what a user could read in its `results` dict. All on CPU, in
float32 (float64, or another dtype forward only, where float32 is not supported).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch_databases import Case, seed_all

Body = Callable[[dict[str, Any]], None]


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in nested lists, tuples and dicts, in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors(v)


def sum_of(value: Any) -> torch.Tensor | None:
    """The sum of every output that requires grad (real and imaginary parts of complex ones);
    None when none does."""
    total = None
    for t in tensors(value):
        if not t.requires_grad or not (t.is_floating_point() or t.is_complex()):
            continue
        part = t.real.sum() + t.imag.sum() if t.is_complex() else t.sum()
        total = part if total is None else total + part
    return total


def raising(exc: BaseException) -> Body:
    """A body for inputs that could not be built: the same error on both sides."""

    def body(results: dict[str, Any]) -> None:
        results["building inputs raised"] = [type(exc).__name__, str(exc)]

    return body


def pick_dtype(supported: Any) -> torch.dtype:
    """float32, else float64, else the first supported dtype by name."""
    for dtype in (torch.float32, torch.float64):
        if dtype in supported:
            return dtype
    return sorted(supported, key=str)[0]


# ----- module_db -------------------------------------------------------------------------------


def module_body(info: Any, sample: Any, dtype: torch.dtype, mode: str) -> Body:
    """Build the module, run forward (under no_grad for inference); in train and eval mode,
    backward of the sum of outputs, then the gradients of parameters and leaf inputs."""

    def body(results: dict[str, Any]) -> None:
        ctor = sample.constructor_input
        module = info.module_cls(*ctor.args, **ctor.kwargs)
        module.to(dtype=dtype)
        module.train(mode == "train")
        fwd = sample.forward_input
        args, kwargs = (fwd.args, fwd.kwargs) if fwd is not None else ((), {})
        grad_mode = torch.no_grad() if mode == "inference" else contextlib.nullcontext()
        with grad_mode:
            results["output"] = module(*args, **kwargs)
        results["buffers"] = dict(module.named_buffers())
        loss = sum_of(results["output"])
        if loss is None:
            return
        loss.backward()
        results["param grads"] = {n: p.grad for n, p in module.named_parameters()}
        leaves = [t for t in tensors((args, kwargs)) if t.requires_grad and t.is_leaf]
        results["input grads"] = [t.grad for t in leaves]

    return body


def module_error_body(info: Any, error: Any) -> Body:
    """Build the module and call it, as test_modules' test_errors does."""

    def body(results: dict[str, Any]) -> None:
        sample = error.module_error_input
        ctor = sample.constructor_input
        module = info.module_cls(*ctor.args, **ctor.kwargs)
        results["built"] = True
        fwd = sample.forward_input
        results["output"] = module(*fwd.args, **fwd.kwargs)

    return body


def module_cases(limit: int | None) -> Iterator[Case]:
    """Every module input of module_db in train, eval and inference mode, and its error inputs."""
    from torch.testing._internal.common_modules import module_db

    for info in module_db:
        dtype = pick_dtype(info.dtypes)
        for mode in ("train", "eval", "inference"):
            group = f"module/{info.name}/{mode}"
            seed_all(group)
            try:
                samples = info.module_inputs_func(
                    info,
                    device="cpu",
                    dtype=dtype,
                    requires_grad=mode != "inference",
                    training=mode == "train",
                )
            except Exception as exc:
                yield f"{group}/inputs", raising(exc)
                continue
            for i, sample in enumerate(samples):
                yield f"{group}/{i} {sample.desc}", module_body(info, sample, dtype, mode)
        if info.module_error_inputs_func is None:
            continue
        group = f"module/{info.name}/errors"
        seed_all(group)
        try:
            errors = info.module_error_inputs_func(
                info, device="cpu", dtype=dtype, requires_grad=True, training=True
            )
        except Exception as exc:
            yield f"{group}/inputs", raising(exc)
            continue
        for i, error in enumerate(errors):
            yield f"{group}/{i}", module_error_body(info, error)


# ----- op_db -----------------------------------------------------------------------------------


def op_body(op: Any, sample: Any, with_grad: bool, inplace: bool = False) -> Body:
    """Call the op (its in-place variant, on a clone of an input that requires grad); with
    gradients, backward of the sum of its (processed) outputs into every input that requires
    grad. The inputs are digested after the call too."""

    def body(results: dict[str, Any]) -> None:
        first = sample.input
        if inplace:
            if isinstance(first, torch.Tensor) and first.requires_grad:
                first = first.clone()  # in place on a leaf that requires grad is refused
            results["output"] = op.inplace_variant(first, *sample.args, **sample.kwargs)
            results["returns its input"] = results["output"] is first
        else:
            results["output"] = op(first, *sample.args, **sample.kwargs)
        results["inputs after"] = [first, sample.args, sample.kwargs]
        if not with_grad:
            return
        loss = sum_of(sample.output_process_fn_grad(results["output"]))
        if loss is None:
            return
        everything = [sample.input, sample.args, sample.kwargs]
        inputs = [t for t in tensors(everything) if t.requires_grad]
        results["grads"] = torch.autograd.grad(loss, inputs, allow_unused=True)

    return body


def op_error_body(op: Any, error: Any) -> Body:
    """Call the op on an input it must refuse."""

    def body(results: dict[str, Any]) -> None:
        sample = error.sample_input
        results["output"] = op(sample.input, *sample.args, **sample.kwargs)

    return body


def op_samples(op: Any, group: str, dtype: torch.dtype, grad: bool, limit: int | None) -> Any:
    """The first `limit` sample inputs, seeded by the group; or the error building them."""
    seed_all(group)
    try:
        return list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=grad), limit))
    except Exception as exc:
        return exc


def op_cases(limit: int | None) -> Iterator[Case]:
    """The first `limit` sample inputs (also through the in-place variant, where the op has
    one) and error inputs of every op in op_db."""
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        name = f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name
        if not op.supported_dtypes("cpu"):
            yield f"op/{name}", "no dtype supported on CPU"
            continue
        dtype = pick_dtype(op.supported_dtypes("cpu"))
        with_grad = op.supports_autograd and dtype in op.supported_backward_dtypes("cpu")
        group = f"op/{name}/{str(dtype).removeprefix('torch.')}"
        for inplace in (False, True) if op.inplace_variant is not None else (False,):
            where = f"{group}/inplace" if inplace else group
            samples = op_samples(op, where, dtype, with_grad, limit)
            if isinstance(samples, Exception):
                yield f"{where}/inputs", raising(samples)
                continue
            for i, sample in enumerate(samples):
                yield f"{where}/{i}", op_body(op, sample, with_grad, inplace)
        if op.error_inputs_func is None:
            continue
        seed_all(f"{group}/errors")
        try:
            errors = list(itertools.islice(op.error_inputs("cpu"), limit))
        except Exception as exc:
            yield f"{group}/errors", raising(exc)
            continue
        for i, error in enumerate(errors):
            yield f"{group}/error{i}", op_error_body(op, error)


# ----- optim_db --------------------------------------------------------------------------------


def optim_problem(info: Any) -> tuple[list[torch.Tensor], Callable[[list], torch.Tensor]]:
    """Small parameters and a loss of them: an MLP, its weights only for Muon (2-D params
    only), an embedding with sparse gradients for SparseAdam."""
    if info.only_supports_sparse_grads:
        idx = torch.tensor([[1, 2, 4], [4, 3, 9]])
        weight = nn.Parameter(torch.randn(10, 3))
        return [weight], lambda p: nn.functional.embedding(idx, p[0], sparse=True).pow(2).sum()
    x, y = torch.randn(5, 4), torch.randn(5, 2)
    w1, w2 = nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(2, 3))
    if info.name == "Muon":
        return [w1, w2], lambda p: ((torch.tanh(x @ p[0].T) @ p[1].T - y) ** 2).mean()
    b1, b2 = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(2))

    def mlp(p: list) -> torch.Tensor:
        return ((torch.tanh(x @ p[0].T + p[1]) @ p[2].T + p[3] - y) ** 2).mean()

    return [w1, b1, w2, b2], mlp


def optim_body(info: Any, kwargs: dict[str, Any], steps: int = 3) -> Body:
    """A few steps (with a closure) of the optimizer on a small problem; losses, parameters
    after each step, and the final state dict. A differentiable optimizer updates non-leaf
    clones (in place on a leaf that requires grad is refused), as PyTorch's own tests do."""

    def body(results: dict[str, Any]) -> None:
        params, loss_fn = optim_problem(info)
        if kwargs.get("differentiable"):
            params = [p.clone() for p in params]
            for p in params:
                p.retain_grad()
        opt = info.optim_cls(params, **kwargs)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = loss_fn(params)
            loss.backward(retain_graph=bool(kwargs.get("differentiable")))
            return loss

        for step in range(steps):
            results[f"loss {step}"] = opt.step(closure)
            results[f"params {step}"] = [p.detach().clone() for p in params]
        results["state"] = opt.state_dict()

    return body


def optim_error_body(info: Any, error: Any) -> Body:
    """Construct the optimizer, and step it when the error is expected there."""
    from torch.testing._internal.common_optimizers import OptimizerErrorEnum

    def body(results: dict[str, Any]) -> None:
        config = error.optimizer_error_input
        opt = info.optim_cls(config.params, **config.kwargs)
        results["built"] = True
        if error.error_on == OptimizerErrorEnum.STEP_ERROR:
            results["step"] = opt.step()

    return body


def optim_cases(limit: int | None) -> Iterator[Case]:
    """Every config of every optimizer in optim_db with each implementation flag (foreach too,
    which PyTorch's helper leaves out on CPU), and its error inputs."""
    from torch.testing._internal.common_optimizers import (
        _get_optim_inputs_including_global_cliquey_kwargs,
        optim_db,
    )

    for info in optim_db:
        group = f"optim/{info.name}"
        seed_all(group)
        configs = _get_optim_inputs_including_global_cliquey_kwargs("cpu", torch.float32, info)
        for i, config in enumerate(configs):
            yield f"{group}/{i} {config.desc}", optim_body(info, config.kwargs)
            if "foreach" in info.supported_impls and "&" not in config.desc:
                foreach = {**config.kwargs, "foreach": True}
                yield f"{group}/{i} {config.desc} & foreach", optim_body(info, foreach)
        seed_all(f"{group}/errors")
        try:
            errors = info.optim_error_inputs_func(device="cpu", dtype=torch.float32)
        except Exception as exc:
            yield f"{group}/errors", raising(exc)
            continue
        for i, error in enumerate(errors):
            yield (
                f"{group}/error{i} {error.optimizer_error_input.desc}",
                optim_error_body(info, error),
            )


CASES: dict[str, Callable[[int | None], Iterator[Case]]] = {
    "module": module_cases,
    "op": op_cases,
    "optim": optim_cases,
}
