"""Backward calls: what each `backward()` / `torch.autograd.grad` walked, released and raised.

The walk runs over the recorded graph (records only, never live nodes), before the engine runs.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Any, Protocol

import torch

from autograd_magic.model.records import BackwardCall, Site
from autograd_magic.recorder import install, torch_api
from autograd_magic.recorder.ops import OpKind
from autograd_magic.recorder.tracebacks import drop_recorder_tail

if TYPE_CHECKING:
    from autograd_magic.recorder.writer import TraceWriter

_TENSOR_BACKWARD = torch.Tensor.backward
_AUTOGRAD_BACKWARD = torch.autograd.backward
_GRAD = torch.autograd.grad
BACKWARD_SIGNATURES = {
    torch.Tensor.backward: inspect.signature(torch.Tensor.backward),
    _AUTOGRAD_BACKWARD: inspect.signature(_AUTOGRAD_BACKWARD),
    _GRAD: inspect.signature(_GRAD),
}


def _signature(func: Any, kind: OpKind) -> inspect.Signature:
    """The signature to bind a backward call's arguments by. Watch mode's counted steps patch
    `torch.autograd.grad` / `backward` with `*args` wrappers, and torch passes the name it finds
    in its module (the wrapper) to the mode: such a call binds as torch's own."""
    found = BACKWARD_SIGNATURES.get(func)
    if found is not None:
        return found
    return BACKWARD_SIGNATURES[_GRAD if kind is OpKind.GRAD else _AUTOGRAD_BACKWARD]


class BackwardHost(Protocol):
    """What backward recording needs from the recorder."""

    writer: TraceWriter

    def site(self) -> Site:
        """The user's source position: the innermost frame outside torch and the recorder."""
        ...

    def check_numpy_writes(self) -> None:
        """Record NumPy writes made since the last check (before a backward reads the data)."""
        ...

    def root_node_ids(self, roots: list[torch.Tensor]) -> list[int]:
        """The recorded node ids of the roots' `grad_fn`s (recording any not seen yet)."""
        ...

    def read_holders(self) -> None:
        """Ask who holds the saved storages (so this call's freed bytes count what it frees)."""
        ...


def run_backward(host: BackwardHost, func: Any, kind: OpKind, args: tuple, kwargs: dict) -> Any:
    """Run `backward()` / `autograd.grad` and record it: line, flags, what it walked and released,
    and its error (recorded, then re-raised unchanged)."""
    __tracebackhide__ = True
    writer = host.writer
    site = host.site()
    if func is _TENSOR_BACKWARD and len(args) == 1 and not kwargs:
        arguments = {"self": args[0]}  # `loss.backward()`: what `bind` gives, without its cost
    else:
        arguments = _signature(func, kind).bind(*args, **kwargs).arguments
    create_graph = bool(arguments.get("create_graph", False))
    retain_graph = arguments.get("retain_graph")
    retain_graph = create_graph if retain_graph is None else bool(retain_graph)
    host.check_numpy_writes()
    call = BackwardCall(
        "grad" if kind is OpKind.GRAD else "backward",
        writer.next_seq(),
        site,
        retain_graph,
        create_graph,
    )
    index = writer.add_backward_call(call)
    reached: list[int] = []
    # Bookkeeping must never stop the user's backward, and a tensor subclass root must not
    # see its reads (`grad_fn`) through its own `__torch_function__`.
    with contextlib.suppress(Exception), torch_api.DisableTorchFunctionSubclass():
        reached = _reach(host, call, index, _backward_roots(arguments))
    with contextlib.suppress(Exception):  # bookkeeping must never stop the backward
        host.read_holders()
    writer.backward_running(call)
    try:
        return _call_user(func, args, kwargs)
    except BaseException as exc:
        writer.backward_failed(call, exc, reached)
        drop_recorder_tail(exc)
        raise
    finally:
        writer.backward_ended(call)


def _reach(
    host: BackwardHost, call: BackwardCall, index: int, roots: list[torch.Tensor]
) -> list[int]:
    """What the `index`-th backward call of the block is about to traverse, by the records
    (recording any root not seen yet)."""
    return host.writer.backward_reach(call, index, host.root_node_ids(roots))


def _backward_roots(arguments: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors a backward/grad call starts from."""
    roots = arguments.get("self", arguments.get("tensors", arguments.get("outputs")))
    if isinstance(roots, torch.Tensor):
        return [roots]
    if isinstance(roots, (list, tuple)):
        return [t for t in roots if isinstance(t, torch.Tensor)]
    return []


def _call_user(func: Any, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True
    return func(*args, **kwargs)


# Backward runs the user's hooks and custom backward methods: a debugger steps into them.
install.PASS_THROUGH.add(_call_user.__code__)
