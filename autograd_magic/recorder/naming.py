"""Walks what the user can see (a namespace, containers, attributes, module children) to name
objects the way the user would type them: `a`, `losses[3]`, `model.fc.weight`, `crit.loss`.

Breadth-first, so the shortest path wins; time-boxed, and says so when cut.
"""

from __future__ import annotations

import inspect
import sys
import time
import types
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

_SKIP_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
_ATOMIC = (str, bytes, int, float, complex, bool, type(None), range, slice)
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
MAX_CONTAINER_ITEMS = 10_000


def _children(obj: Any, path: str) -> Iterator[tuple[Any, str]]:
    if isinstance(obj, torch.nn.Module):
        for name, child in obj._modules.items():
            if child is not None:
                yield child, f"{path}.{name}"
        for name, param in obj._parameters.items():
            if param is not None:
                yield param, f"{path}.{name}"
        for name, buf in obj._buffers.items():
            if buf is not None:
                yield buf, f"{path}.{name}"
        attrs = obj.__dict__
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj[:MAX_CONTAINER_ITEMS]):
            yield item, f"{path}[{i}]"
        return
    elif isinstance(obj, dict):
        for i, (key, item) in enumerate(obj.items()):
            if i >= MAX_CONTAINER_ITEMS:
                return
            if isinstance(key, (str, int)):
                yield item, f"{path}[{key!r}]"
        return
    elif isinstance(obj, torch.optim.Optimizer):
        yield from _optimizer_state(obj, path)
        return
    elif isinstance(obj, torch.Tensor) or type(obj).__module__ == "numpy":
        return
    else:
        found = getattr(obj, "__dict__", None)
        if not isinstance(found, dict):
            return
        attrs = found
    for name, value in attrs.items():
        if not name.startswith("_"):
            yield value, f"{path}.{name}"


def param_mark(param: Any) -> str:
    """A stand-in for a parameter's name inside a path, replaced once the walk has named it."""
    return f"\x00{id(param)}\x00"


def _optimizer_state(opt: torch.optim.Optimizer, path: str) -> Iterator[tuple[Any, str]]:
    """`opt.state[<param>]["exp_avg"]`: the state tensors, as the user would reach them. Only the
    optimizer's own dicts are read (plain data, no user code runs)."""
    state = opt.__dict__.get("state")
    if not isinstance(state, dict):
        return
    for i, (param, entry) in enumerate(state.items()):
        if i >= MAX_CONTAINER_ITEMS or not isinstance(entry, dict):
            return
        for key, value in entry.items():
            if isinstance(key, str) and isinstance(value, torch.Tensor):
                yield value, f"{path}.state[{param_mark(param)}][{key!r}]"


def resolve_param_marks(path: str, param_names: Mapping[int, str]) -> str:
    """Put each parameter's name (`model.0.weight`, else `param`) where `param_mark` stood."""
    if "\x00" not in path:
        return path
    parts = path.split("\x00")
    for i in range(1, len(parts), 2):
        parts[i] = param_names.get(int(parts[i]), "param")
    return "".join(parts)


def walk_namespace(
    roots: Mapping[str, Any],
    visit: Callable[[Any, str], None],
    max_depth: int = 4,
    budget_s: float = 0.25,
) -> bool:
    """Call `visit(obj, path)` for each path to each object reachable from `roots` (shortest
    first; each object walked into once); False when time ran out."""
    deadline = time.perf_counter() + budget_s
    seen: set[int] = set()
    queue: deque[tuple[Any, str, int]] = deque()
    for name, obj in list(roots.items()):
        if not name.startswith("_") and name not in _SKIP_NAMES:
            queue.append((obj, name, 0))
    steps = 0
    while queue:
        obj, path, depth = queue.popleft()
        if isinstance(obj, (*_ATOMIC, *_OPAQUE)):
            continue
        if id(obj) in seen:
            # Seen before under a shorter path: report this path too (`loss` is `losses[2]`),
            # but do not walk into it again.
            visit(obj, path)
            continue
        seen.add(id(obj))
        visit(obj, path)
        steps += 1
        if steps % 512 == 0 and time.perf_counter() > deadline:
            return False
        if depth < max_depth:
            for child, child_path in _children(obj, path):
                queue.append((child, child_path, depth + 1))
    return True


def find_names(
    roots: Mapping[str, Any],
    wanted: Mapping[int, int],
    budget_s: float = 0.25,
    also: Callable[[Any, str], None] | None = None,
) -> tuple[dict[int, str], bool]:
    """Map uid -> shortest user path for objects whose address is in `wanted` (address -> uid);
    `also(obj, path)` sees every visited object in the same walk."""
    names: dict[int, str] = {}

    def visit(obj: Any, path: str) -> None:
        uid = wanted.get(id(obj))
        if uid is not None and uid not in names:
            names[uid] = path
        if also is not None:
            also(obj, path)

    complete = walk_namespace(roots, visit, budget_s=budget_s)
    return names, complete


def frame_namespace(frame: types.FrameType) -> dict[str, Any]:
    """A copy of the globals and locals visible in `frame`.

    Before Python 3.13, reading `f_locals` of a function frame caches a snapshot dict on the frame
    that keeps every local's value alive until the function returns, even after the user deletes
    or rebinds the name: tracking would extend the life of tensors and graphs. The snapshot is
    emptied once copied (the next `locals()` or debugger access rebuilds it from the real locals).
    """
    f_locals = frame.f_locals
    namespace = {**frame.f_globals, **f_locals}
    if (
        sys.version_info < (3, 13)
        and frame.f_code.co_flags & inspect.CO_OPTIMIZED
        and f_locals is not frame.f_globals
    ):
        f_locals.clear()
    return namespace
