"""Walks what the user can see (a namespace, containers, attributes, module children) to name
objects the way the user would type them: `a`, `losses[3]`, `model.fc.weight`, `crit.loss`.

Breadth-first, so the shortest path wins; time-boxed, and says so when cut.
"""

from __future__ import annotations

import ctypes
import inspect
import sys
import time
import types
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import torch

from autograd_magic.recorder.torch_api import MODULE_TABLES

_ATOMIC = (str, bytes, int, float, complex, bool, type(None), range, slice)
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
_LEAVES = (*_ATOMIC, *_OPAQUE)
# Exact types of the commonest leaves, skipped by a set lookup where containers are listed.
_PLAIN_ATOMS = frozenset({str, int, float, bool, type(None)})
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_SHORT = 64
MAX_CONTAINER_ITEMS = 10_000


_DICTS = (dict, OrderedDict)
_MODULE_PARTS = (torch.nn.Module, torch.Tensor)
_OWN_PACKAGE = __name__.split(".")[0] + "."


def _children(obj: Any, path: str, skipped: set[str]) -> Iterator[tuple[Any, str]]:
    """What `obj` holds, read without running any user code: lists, tuples and dicts (subclasses
    too, through the built-in methods), an instance `__dict__` read through the standard slot, a
    module's children/parameters/buffers. An object whose class replaced `__dict__` is left out
    and its type added to `skipped`."""
    kind = type(obj)
    # Subclasses are read through the built-in type's own C methods: never their overrides.
    if issubclass(kind, (list, tuple)):
        base = list if issubclass(kind, list) else tuple
        for i, item in enumerate(base.__getitem__(obj, slice(0, MAX_CONTAINER_ITEMS))):
            # Nothing to name in a leaf: a list of plain numbers costs no path string.
            if type(item) not in _PLAIN_ATOMS:
                yield item, f"{path}[{i}]"
        return
    if issubclass(kind, dict):
        for i, (key, item) in enumerate(dict.items(obj)):
            if i >= MAX_CONTAINER_ITEMS:
                return
            if (type(key) is str or type(key) is int) and type(item) not in _PLAIN_ATOMS:
                yield item, f"{path}[{key!r}]"
        return
    if issubclass(kind, torch.optim.Optimizer):
        yield from _optimizer_state(obj, path)
        return
    if issubclass(kind, torch.Tensor) or kind.__module__ == "numpy":
        return
    distributions = sys.modules.get("torch.distributions")
    if distributions is not None and issubclass(kind, distributions.Distribution):
        # It caches its parameters (`probs`, `logits`) as it is used: a library's cache of the
        # user's tensors, not a place the user keeps them.
        return
    if kind.__module__.startswith(_OWN_PACKAGE):
        # Traces stored by earlier cells (`-o NAME`) hold records, not the user's tensors:
        # walking their thousands of records would spend the naming budget for nothing.
        return
    attrs = _instance_dict(obj, kind)
    if attrs is None:
        if _may_hold_dict(kind):
            skipped.add(kind.__qualname__)
        return
    if issubclass(kind, torch.nn.Module):
        for field in MODULE_TABLES:
            table: Any = attrs.get(field)
            if type(table) in _DICTS:
                for name, child in dict.items(table):
                    if child is not None and type(name) is str:
                        yield child, f"{path}.{name}"
    for name, value in dict.items(attrs):
        if type(name) is str and not name.startswith("_"):
            yield value, f"{path}.{name}"


def _nothing_worth(child: Any, worth: Callable[[torch.Tensor], bool] | None) -> bool:
    """True where no visit of `child` or of what it holds can note anything: a plain tensor that
    `worth` does not want (without `worth`, every tensor is wanted), and a short plain list,
    tuple or dict of such tensors and plain numbers (`history[i]` = [loss, acc], a dataset's
    `(x, y)` sample)."""
    kind = type(child)
    if kind is _Tensor:
        return worth is not None and not worth(child)
    if kind is tuple or kind is list:
        items: Any = child
    elif kind is dict:
        items = dict.values(child)
    else:
        return False
    if len(child) > _SHORT:
        return False
    for item in items:
        item_kind = type(item)
        if item_kind is _Tensor:
            if worth is None or worth(item):
                return False
        elif item_kind not in _PLAIN_ATOMS:
            return False
    return True


def _dict_descriptor(kind: type) -> Any:
    for klass in kind.__mro__:
        found = type.__dict__["__dict__"].__get__(klass).get("__dict__")
        if found is not None:
            return found
    return None


def _may_hold_dict(kind: type) -> bool:
    return _dict_descriptor(kind) is not None


def _instance_dict(obj: Any, kind: type) -> dict | None:
    """`obj.__dict__` through CPython's own slot; None when the class replaced it (a property)."""
    descriptor = _dict_descriptor(kind)
    if type(descriptor).__name__ != "getset_descriptor":
        return None
    try:
        attrs = descriptor.__get__(obj, kind)
    except (AttributeError, TypeError):
        return None
    return attrs if type(attrs) is dict else None


def param_mark(param: Any) -> str:
    """A stand-in for a parameter's name inside a path, replaced once the walk has named it."""
    return f"\x00{id(param)}\x00"


def _optimizer_state(opt: torch.optim.Optimizer, path: str) -> Iterator[tuple[Any, str]]:
    """`opt.state[<param>]["exp_avg"]`: the state tensors, as the user would reach them. Only the
    optimizer's own dicts are read (plain data, no user code runs)."""
    attrs = _instance_dict(opt, type(opt))
    state = None if attrs is None else attrs.get("state")
    if not isinstance(state, dict):
        return
    for i, (param, entry) in enumerate(dict.items(state)):
        if i >= MAX_CONTAINER_ITEMS or type(entry) is not dict:
            return
        for key, value in dict.items(entry):
            if type(key) is str and issubclass(type(value), torch.Tensor):
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
    skipped: set[str] | None = None,
    worth: Callable[[torch.Tensor], bool] | None = None,
    ignore: Collection[str] = (),
) -> bool:
    """Call `visit(obj, path)` for each path to each object reachable from `roots` (shortest
    first; each object walked into once); False when time ran out. Types not walked into
    because reading them would run user code are added to `skipped`. Short plain containers of
    plain numbers are not visited, nor, where `worth(tensor)` is False, a plain tensor found
    inside something (a dataset's samples) or such containers of them. Names in `ignore` (what
    the caller knows is not the user's: a notebook's own variables) and private names are not
    walked."""
    skipped = set() if skipped is None else skipped
    deadline = time.perf_counter() + budget_s
    seen: set[int] = set()
    queue: deque[tuple[Any, str, int]] = deque()
    for name, obj in list(roots.items()):
        if not name.startswith("_") and name not in ignore:
            queue.append((obj, name, 0))
    steps = 0
    while queue:
        obj, path, depth = queue.popleft()
        kind = type(obj)
        if issubclass(kind, _LEAVES):
            continue
        address = id(obj)
        if address in seen:
            # Seen before under a shorter path: report this path too (`loss` is `losses[2]`),
            # but do not walk into it again.
            visit(obj, path)
            continue
        seen.add(address)
        visit(obj, path)
        steps += 1
        if steps % 512 == 0 and time.perf_counter() > deadline:
            return False
        # A tensor holds nothing to walk into (`_children` yields nothing for one): a dataset
        # of tensors in a list costs a visit each, not a visit and a generator.
        if depth < max_depth and not (kind is _Tensor or kind is _Parameter):
            # A module's submodules and tensors cost no depth: `model.encoder.layers.0.self_attn
            # .in_proj_weight` is as close to the user as `model`; the tree is finite.
            in_module = issubclass(kind, torch.nn.Module)
            for child, child_path in _children(obj, path, skipped):
                if _nothing_worth(child, worth):
                    # Counted against the budget as a visit would be: a list of 10,000 skipped
                    # samples takes time too.
                    steps += 1
                    if steps % 512 == 0 and time.perf_counter() > deadline:
                        return False
                    continue
                step = 0 if in_module and issubclass(type(child), _MODULE_PARTS) else 1
                queue.append((child, child_path, depth + step))
    return True


def find_names(
    roots: Mapping[str, Any],
    wanted: Mapping[int, int],
    budget_s: float = 0.25,
    also: Callable[[Any, str], None] | None = None,
    skipped: set[str] | None = None,
    also_wants: Callable[[torch.Tensor], bool] | None = None,
    ignore: Collection[str] = (),
) -> tuple[dict[int, str], bool]:
    """Map uid -> shortest user path for objects whose address is in `wanted` (address -> uid);
    `also(obj, path)` sees every visited object in the same walk. `also_wants(tensor)`: False
    when `also` does nothing for that plain tensor (then, unless wanted, it is not visited)."""
    names: dict[int, str] = {}

    def worth(tensor: torch.Tensor) -> bool:
        return id(tensor) in wanted or (also_wants is not None and also_wants(tensor))

    def visit(obj: Any, path: str) -> None:
        uid = wanted.get(id(obj))
        if uid is not None and uid not in names:
            names[uid] = path
        if also is not None:
            also(obj, path)

    complete = walk_namespace(
        roots,
        visit,
        budget_s=budget_s,
        skipped=skipped,
        worth=None if also_wants is None else worth,
        ignore=ignore,
    )
    return names, complete


def frame_namespace(frame: types.FrameType) -> dict[str, Any] | None:
    """A copy of the globals and locals visible in `frame`, leaving the frame as it was; None when
    the locals of this frame cannot be read without changing what the user holds.

    Before Python 3.13, reading `f_locals` of a function frame refreshes a snapshot dict cached on
    the frame: the very dict an earlier `locals()` or `vars()` returned to the user. Reading it
    would both change the user's dict and keep every local's value alive until the function
    returns. So the cached dict is put back exactly as it was (emptied if the frame had none).
    """
    if sys.version_info >= (3, 13) or not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        return {**frame.f_globals, **frame.f_locals}
    found, cached = _cached_locals(frame)
    if not found:
        return None
    before = None if cached is None else dict(cached)
    f_locals = frame.f_locals
    namespace = {**frame.f_globals, **f_locals}
    f_locals.clear()
    if before is not None:
        f_locals.update(before)
    return namespace


# Offsets (in pointers) of `f_code`, `f_globals` and the cached `f_locals` in CPython's
# _PyInterpreterFrame, reached from PyFrameObject.f_frame (the 4th pointer of the frame object);
# Python 3.10 keeps them in the frame object itself (after ob_refcnt, ob_type, ob_size, f_back).
_FRAME_LAYOUTS = {(3, 10): (4, 6, 7), (3, 11): (4, 1, 3), (3, 12): (0, 3, 5)}
_IN_FRAME_OBJECT = sys.version_info[:2] == (3, 10)


def _cached_locals(frame: types.FrameType) -> tuple[bool, dict | None]:
    """(layout known, the dict cached on `frame` or None) read without refreshing it."""
    layout = _FRAME_LAYOUTS.get(sys.version_info[:2])
    if layout is None:
        return False, None
    code_at, globals_at, locals_at = layout
    pointer = ctypes.POINTER(ctypes.c_void_p)
    interpreter_frame = id(frame) if _IN_FRAME_OBJECT else ctypes.cast(id(frame), pointer)[3]
    if not interpreter_frame:
        return False, None
    slots = ctypes.cast(interpreter_frame, pointer)
    # The layout is checked against the frame's own code and globals before trusting it.
    if slots[code_at] != id(frame.f_code) or slots[globals_at] != id(frame.f_globals):
        return False, None
    address = slots[locals_at]
    if not address:
        return True, None
    cached = ctypes.cast(address, ctypes.py_object).value
    return (True, cached) if type(cached) is dict else (False, None)
