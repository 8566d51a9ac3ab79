"""What `torch.compile` sees of the recorder: nothing of ours to compile, only plain calls.

Dynamo meets the recorder in two ways. Tracing a user function, it inlines what the user's code
calls: the mode's `__torch_function__`, the global module hooks, the patched entry points. Each
of those starts with `if torch.compiler.is_compiling():` and then makes the plain call (the
original object, so Dynamo recognizes it by identity): the graphs and breaks are untracked
code's, and the guards differ only by our mode and hooks being there (the same in every block).

Running a frame it could not compile (a graph break in a loop), Dynamo offers every Python
frame called from it for compilation as a frame of its own: a frame of ours compiled there is
traced with `is_compiling()` true and its guards do not cover what varies (`func` in
`__torch_function__`), so it silently replays another call's result. Marking each of our code
objects "skip" (`torch._dynamo.eval_frame.skip_code`) keeps Dynamo from compiling them as frames
of their own while leaving them inlinable.

Dynamo also resolves some torch functions by name, once, the first time it needs them
(`torch.from_numpy` has a handler keyed by the object found then): resolved while a block has
its patches in, it would know our wrapper instead of torch's function, in that block and after.
So it resolves them here, with torch's originals put back for the moment.

Dynamo takes seconds to import, so it is never imported here: the marks are set when a block
begins with Dynamo loaded, or, while a block runs, right after something imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Iterable
from types import CodeType, ModuleType
from typing import Any

from autograd_magic.recorder import torch_api

_PACKAGE = "autograd_magic"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Where a method, property or decorated function keeps the function holding its code.
_INNER_CALLABLES = ("__func__", "__wrapped__", "fget", "fset", "fdel")
_DYNAMO = torch_api.DYNAMO_MODULE
_marked_modules: set[str] = set()
_modules_seen = 0  # len(sys.modules) at the last scan: a block's start rescans only after imports
_with_originals: Callable[[Callable[[], None]], None] | None = None
_code_sources: list[Callable[[], Iterable[CodeType]]] = []


def also_skip(source: Callable[[], Iterable[CodeType]]) -> None:
    """Have `keep_out` also mark the code objects `source()` returns (code made at run time)."""
    _code_sources.append(source)


def dynamo_loaded() -> bool:
    """True once `torch._dynamo` has been imported in this process, and its import has ended:
    while another thread is importing it, its names are not all there yet (and importing one of
    them from here would break that thread's import too)."""
    module = sys.modules.get(_DYNAMO)
    return module is not None and not getattr(module.__spec__, "_initializing", False)


def skip_if_loaded(code: CodeType) -> None:
    """Keep Dynamo from compiling `code` (a stand-in made just now) as a frame of its own;
    without Dynamo loaded, `keep_out` marks it later."""
    if dynamo_loaded():
        torch_api.dynamo_skip_code(code)


def keep_out(
    with_originals: Callable[[Callable[[], None]], None], just_imported: bool = False
) -> None:
    """Mark the code of every loaded module of the package and have Dynamo resolve torch's
    functions (run by `with_originals`, which puts torch's originals back meanwhile); with
    Dynamo not loaded yet, watch for its import instead (until `stop_watching`).
    `just_imported`: called by the watcher right after Dynamo's module ran on this thread
    (its import is not marked as ended until the watcher returns)."""
    global _modules_seen, _with_originals
    _with_originals = with_originals
    if not (just_imported or dynamo_loaded()):
        if not any(type(finder) is _DynamoImportWatcher for finder in sys.meta_path):
            sys.meta_path.insert(0, _DynamoImportWatcher())
        return
    if not torch_api.dynamo_names_resolved():
        with_originals(torch_api.dynamo_resolve_names)
    if len(sys.modules) == _modules_seen:
        return
    _modules_seen = len(sys.modules)
    for name, module in list(sys.modules.items()):
        if (name == _PACKAGE or name.startswith(_PACKAGE + ".")) and name not in _marked_modules:
            if isinstance(module, ModuleType):
                for code in _codes_of_module(module):
                    torch_api.dynamo_skip_code(code)
            _marked_modules.add(name)
    for source in _code_sources:
        for code in source():
            torch_api.dynamo_skip_code(code)


def stop_watching() -> None:
    """Remove the import watcher that `keep_out` installed, if it is still there."""
    sys.meta_path[:] = [f for f in sys.meta_path if type(f) is not _DynamoImportWatcher]


def _codes_of_module(module: ModuleType) -> list[CodeType]:
    """Every code object defined in `module`: functions, methods, properties, nested code, and
    the methods that dataclasses and named tuples generate (file `<string>`)."""
    found: list[CodeType] = []
    seen: set[int] = set()

    def add(code: CodeType) -> None:
        if id(code) in seen or not code.co_filename.startswith((_PACKAGE_DIR, "<")):
            return  # a function of torch or the standard library assigned here is not ours
        seen.add(id(code))
        found.append(code)
        for const in code.co_consts:
            if isinstance(const, CodeType):
                add(const)

    def add_callable(obj: Any) -> None:
        inners = (obj, *(getattr(obj, a, None) for a in _INNER_CALLABLES))
        for inner in inners:
            code = getattr(inner, "__code__", None)
            if isinstance(code, CodeType):
                add(code)

    for value in list(vars(module).values()):
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if isinstance(value, type):
            for member in list(vars(value).values()):
                add_callable(member)
        else:
            add_callable(value)
    return found


class _DynamoImportWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `torch._dynamo` is imported, it marks our code right after
    the module has run (see `keep_out`)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != _DYNAMO:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _MarkAfterLoading(spec.loader)
        return spec


class _MarkAfterLoading(importlib.abc.Loader):
    """Runs the real loader, gives the module its real loader back, then marks our code."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self._loader  # type: ignore[union-attr]
        self._loader.exec_module(module)
        stop_watching()
        if _with_originals is not None:
            keep_out(_with_originals, just_imported=True)
