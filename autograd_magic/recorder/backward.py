"""Backward calls: what each `backward()` / `torch.autograd.grad` walked, released and raised.

The walk runs over the recorded graph (records only, never live nodes), before the engine runs.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Any

import torch

from autograd_magic.model.records import BackwardCall
from autograd_magic.recorder.ops import OpKind

if TYPE_CHECKING:
    from autograd_magic.recorder.core import Recorder

_TENSOR_BACKWARD = torch.Tensor.backward
BACKWARD_SIGNATURES = {
    torch.Tensor.backward: inspect.signature(torch.Tensor.backward),
    torch.autograd.backward: inspect.signature(torch.autograd.backward),
    torch.autograd.grad: inspect.signature(torch.autograd.grad),
}


def run_backward(recorder: Recorder, func: Any, kind: OpKind, args: tuple, kwargs: dict) -> Any:
    """Run `backward()` / `autograd.grad` and record it: line, flags, what it walked and released,
    and its error (recorded, then re-raised unchanged)."""
    __tracebackhide__ = True
    trace = recorder.trace
    site = recorder._sites.here(2)
    if func is _TENSOR_BACKWARD and len(args) == 1 and not kwargs:
        arguments = {"self": args[0]}  # `loss.backward()`: what `bind` gives, without its cost
    else:
        arguments = BACKWARD_SIGNATURES[func].bind(*args, **kwargs).arguments
    create_graph = bool(arguments.get("create_graph", False))
    retain_graph = arguments.get("retain_graph")
    retain_graph = create_graph if retain_graph is None else bool(retain_graph)
    recorder.aliases.check_numpy_writes()
    call = BackwardCall(
        "grad" if kind is OpKind.GRAD else "backward",
        trace._next_seq(),
        site,
        retain_graph,
        create_graph,
    )
    trace.backward_calls.append(call)
    reached: list[int] = []
    # Bookkeeping must never stop the user's backward.
    with contextlib.suppress(Exception):
        reached = _reach(recorder, call, _backward_roots(arguments))
    trace._active_backward = call
    trace._sample("backward start", site, force=True)
    try:
        return func(*args, **kwargs)
    except BaseException as exc:
        call.error = str(exc)
        call.error_type = type(exc).__name__
        call.reached = tuple(reached)
        raise
    finally:
        trace._active_backward = None
        call.end_seq = trace._next_seq()
        trace._sample("backward", site, force=True)


def _reach(recorder: Recorder, call: BackwardCall, roots: list[torch.Tensor]) -> list[int]:
    """Walk the recorded graph a backward call is about to traverse (records only, no nodes)."""
    recorder._register_outputs(roots, len(recorder._unowned))
    trace = recorder.trace
    root_ids = []
    for tensor in roots:
        tag = None if tensor.grad_fn is None else tensor.grad_fn.metadata.get(recorder._key)
        if tag is not None:
            root_ids.append(tag.node_id)
    call.root_ids = tuple(root_ids)
    index = len(trace.backward_calls) - 1
    previous = trace.backward_calls[-2].seq if index > 0 else 0
    seen, stack = set(root_ids), list(root_ids)
    while stack:
        record = trace.node(stack.pop())
        if record is None:
            continue
        if record.reached_by is None:
            record.reached_by = index
        if record.born_seq < previous and not record.existed_before:
            call.earlier_nodes += 1
        for child in record.next_ids:
            if child not in seen:
                seen.add(child)
                stack.append(child)
    call.graph_nodes = len(seen)
    if call.retain_graph:
        call.reached = tuple(seen)
    return list(seen)


def _backward_roots(arguments: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors a backward/grad call starts from."""
    roots = arguments.get("self", arguments.get("tensors", arguments.get("outputs")))
    if isinstance(roots, torch.Tensor):
        return [roots]
    if isinstance(roots, (list, tuple)):
        return [t for t in roots if isinstance(t, torch.Tensor)]
    return []
