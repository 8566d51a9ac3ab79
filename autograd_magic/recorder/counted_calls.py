"""The entry points every `counting.StepCounter` shares: wrappers of `torch.autograd.backward` and
`torch.autograd.grad`, and one pair of global module forward hooks.

Each is installed once while any counter is, and acts only for the counters of the calling
thread. As `install`'s patches, a wrapper that another tool has wrapped in turn is left in place
at removal (its wrapper still calls ours, which then only passes calls on), and the original
comes back at a later removal once ours is on top again. Traced by torch.compile, each is the
original call and nothing else.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.utils.hooks import RemovableHandle

from autograd_magic.recorder import module_calls, torch_api
from autograd_magic.recorder.deferred import pending, raise_pending

_get_ident = threading.get_ident
_is_compiling = torch.compiler.is_compiling


class Counter(Protocol):
    """What the entry points read and call on each counter."""

    thread: int  # the installing thread: the only one whose calls it counts
    depth: int  # backward calls running on that thread now (a backward inside a backward)
    on_backward_end: Callable[[], None] | None

    def backward_starts(self, roots: Any) -> None: ...

    def module_entered(self, module: torch.nn.Module) -> None: ...

    def module_left(self) -> None: ...


# --- the backward wrappers (installed once, shared by every counter) ---------------------------

_counters: list[weakref.ref[Counter]] = []
_originals: dict[str, Callable[..., Any]] = {}
# Names whose wrapper was left under another patch at removal: that patch still calls ours.
_buried: set[str] = set()


def _active() -> list[Counter]:
    ident = _get_ident()
    return [c for ref in _counters if (c := ref()) is not None and c.thread == ident]


def _run(name: str, roots: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    original = _originals.get(name) or _DEFAULTS[name]
    if _is_compiling():
        return original(*args, **kwargs)
    if pending:
        raise_pending()
    counters = _active()
    outermost = [c for c in counters if c.depth == 0]
    for counter in counters:
        counter.depth += 1
    try:
        for counter in outermost:
            counter.backward_starts(roots)
        return original(*args, **kwargs)
    finally:
        for counter in counters:
            counter.depth -= 1
        for counter in outermost:
            if counter.on_backward_end is not None:
                counter.on_backward_end()


def _backward(*args: Any, **kwargs: Any) -> Any:
    return _run("backward", args[0] if args else kwargs.get("tensors"), args, kwargs)


def _grad(*args: Any, **kwargs: Any) -> Any:
    return _run("grad", args[0] if args else kwargs.get("outputs"), args, kwargs)


# Read as torch's own (help(), `inspect.signature(...).bind` by tools that meet the wrapper).
_backward.__doc__ = torch.autograd.backward.__doc__
_grad.__doc__ = torch.autograd.grad.__doc__
_backward.__signature__ = inspect.signature(torch.autograd.backward)  # type: ignore[attr-defined]
_grad.__signature__ = inspect.signature(torch.autograd.grad)  # type: ignore[attr-defined]
_DEFAULTS: dict[str, Callable[..., Any]] = {
    "backward": torch.autograd.backward,
    "grad": torch.autograd.grad,
}
_OURS: dict[str, Callable[..., Any]] = {"backward": _backward, "grad": _grad}


def add_counter(counter: Counter) -> None:
    """Count `counter`'s thread's backward calls (the wrappers go in if they are not in)."""
    _counters.append(weakref.ref(counter))
    for name, ours in _OURS.items():
        current = getattr(torch.autograd, name)
        if current is ours:
            continue
        if name in _buried and current is not _originals.get(name):
            continue  # ours sits under `current`, which calls it
        _buried.discard(name)
        _originals[name] = current
        setattr(torch.autograd, name, ours)


def remove_counter(counter: Counter) -> None:
    """Stop counting for `counter`; the last one out puts torch's functions back."""
    _counters[:] = [ref for ref in _counters if ref() is not None and ref() is not counter]
    if _counters:
        return
    for name, ours in _OURS.items():
        if getattr(torch.autograd, name) is ours:
            setattr(torch.autograd, name, _originals.pop(name, _DEFAULTS[name]))
            _buried.discard(name)
        else:
            # Patched on top by someone else: theirs stays; ours under it only passes calls on.
            _buried.add(name)


# --- the global module hooks (installed once, shared by every counter) ------------------------

# Under the same keys in every block: torch.compile guards on the hook tables' keys (new keys
# would recompile compiled modules at each install). The ids join the recorder's own
# (`module_calls`), so torch's "is there any global module hook?" check, which compiled modules
# warn on, counts neither.
_PRE = RemovableHandle(torch_api.forward_pre_hooks)
_POST = RemovableHandle(torch_api.forward_hooks, extra_dict=torch_api.forward_hooks_always_called)
_module_counters: list[Counter] = []
WRAPPED = "OptimizedModule"  # torch.compile's wrapper: its only child is the module it wraps


def _module_pre_hook(module: Any, args: Any) -> None:
    # Traced by torch.compile, this is all it sees (Dynamo cannot trace `_get_ident`).
    if _is_compiling():
        return
    for counter in _module_counters:
        counter.module_entered(module)


def _module_hook(module: Any, args: Any, output: Any) -> None:
    if _is_compiling():
        return
    for counter in _module_counters:
        counter.module_left()


def join_module_hooks(counter: Counter) -> None:
    """Tell `counter` of module calls (the global hooks go in if they are not in)."""
    ids = (_PRE.id, _POST.id)
    module_calls._OUR_HOOKS.update(ids)
    torch_api.set_has_any_global_hook(module_calls._has_any_global_hook_but_ours)
    if not any(c is counter for c in _module_counters):
        _module_counters.append(counter)
    torch_api.add_global_forward_hooks(_PRE.id, _module_pre_hook, _POST.id, _module_hook)


def leave_module_hooks(counter: Counter) -> None:
    """Stop telling `counter`; the last one out takes the hooks out."""
    _module_counters[:] = [c for c in _module_counters if c is not counter]
    if _module_counters:
        return
    _PRE.remove()
    _POST.remove()
    module_calls._OUR_HOOKS.difference_update((_PRE.id, _POST.id))
    if not module_calls._OUR_HOOKS:  # the last one out puts torch's check back
        torch_api.set_has_any_global_hook(None)
