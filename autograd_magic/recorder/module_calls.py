"""Which `nn.Module` call each op happens in: global forward pre/post hooks for the block only.

The hooks return None (they never change inputs or outputs) and hold modules weakly. A module's
path is relative to the outermost module being called (`<0>.transformer.h.1.mlp`); the root's
own name (`model`) is found in the user's namespace when the block ends (`root_placeholders`).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils.hooks import RemovableHandle

from autograd_magic.recorder import torch_api
from autograd_magic.recorder.deferred import pending, raise_pending

if TYPE_CHECKING:
    from autograd_magic.recorder.writer import TraceWriter

_is_compiling = torch.compiler.is_compiling
_get_ident = threading.get_ident
# Ids of the global hooks that live trackers registered, and torch's own "is there any global
# module hook?" check, which `torch.compile`d modules use to warn: ours must not count there,
# or tracked code would warn where untracked code does not.
_OUR_HOOKS: set[int] = set()
_WRAPPED = "OptimizedModule"  # torch.compile's wrapper: its inner module's call is the real one
_FIRST_SWEEP = 64  # roots held before dead ones are first dropped


# One pair of global hooks serves every tracker, under the same keys in every block:
# torch.compile guards on these tables' keys, and new keys per block would make compiled code
# recompile in each block (and fall back to eager past its recompile limit).
_PRE = RemovableHandle(torch_api.forward_pre_hooks)
_POST = RemovableHandle(torch_api.forward_hooks, extra_dict=torch_api.forward_hooks_always_called)
_trackers: list[ModuleTracker] = []


def _enter_hook(module: Any, args: Any) -> None:
    # Traced by torch.compile, this is all it sees: our bookkeeping stays out of its graph
    # (Dynamo cannot trace `_get_ident`, see `dynamo`).
    if _is_compiling():
        return
    for tracker in _trackers:
        tracker._enter(module, args)


def _leave_hook(module: Any, args: Any, output: Any) -> None:
    if _is_compiling():
        return
    for tracker in _trackers:
        tracker._leave(module, args, output)


def _has_any_global_hook_but_ours() -> bool:
    tables = torch_api.global_module_hook_tables()
    return any(key not in _OUR_HOOKS for table in tables for key in table)


def add_unseen_pre_hook(hook: Any) -> RemovableHandle:
    """A global module forward pre-hook that torch's "is there any global module hook?" check
    does not count (a compiled module warns when it does: unwatched code would not); take it
    out with `remove_unseen`."""
    handle = register_module_forward_pre_hook(hook)
    _OUR_HOOKS.add(handle.id)
    torch_api.set_has_any_global_hook(_has_any_global_hook_but_ours)
    return handle


def remove_unseen(handle: RemovableHandle) -> None:
    """Take out a hook `add_unseen_pre_hook` put in; the last of ours out puts torch's check
    back."""
    handle.remove()
    _OUR_HOOKS.discard(handle.id)
    if not _OUR_HOOKS:
        torch_api.set_has_any_global_hook(None)


class ModuleTracker:
    """Keeps the stack of module calls and tells the writer the innermost one's path."""

    def __init__(self, writer: TraceWriter) -> None:
        self._writer = writer
        self._stack: list[str] = []
        # Placeholder index -> (root, ids of the modules it indexed); and id(module) -> where it
        # sits, newest root last. Modules are held weakly: ids are checked against the module.
        self._roots: dict[int, tuple[weakref.ref[Any], list[int]]] = {}
        self._paths: dict[int, list[tuple[weakref.ref[Any], int, str]]] = {}
        self._next_root = 0
        self._sweep_at = _FIRST_SWEEP
        self._thread = 0

    def install(self) -> None:
        """Join the global hooks (removed by `remove`); they count the calls made on the
        installing thread only (global hooks see every thread's modules)."""
        self._thread = threading.get_ident()
        torch_api.set_has_any_global_hook(_has_any_global_hook_but_ours)
        if not any(tracker is self for tracker in _trackers):
            _trackers.append(self)
        torch_api.add_global_forward_hooks(_PRE.id, _enter_hook, _POST.id, _leave_hook)
        _OUR_HOOKS.update((_PRE.id, _POST.id))

    def remove(self) -> None:
        """Leave the hooks (the last tracker out removes them); the stack is left as it is (a
        block can end mid-forward)."""
        _trackers[:] = [tracker for tracker in _trackers if tracker is not self]
        if _trackers:
            return
        _PRE.remove()
        _POST.remove()
        _OUR_HOOKS.difference_update((_PRE.id, _POST.id))
        if not _OUR_HOOKS:  # the last tracker out puts torch's check back
            torch_api.set_has_any_global_hook(None)

    def _enter(self, module: Any, args: Any) -> None:
        if _get_ident() != self._thread or type(module).__name__ == _WRAPPED:
            return
        if pending:  # an interrupt caught in one of our finalizers (see deferred)
            raise_pending()
        path = self._path_of(module)
        self._stack.append(path)
        self._writer.module_entered(path)

    def _leave(self, module: Any, args: Any, output: Any) -> None:
        if _get_ident() != self._thread or type(module).__name__ == _WRAPPED or not self._stack:
            return
        self._stack.pop()
        self._writer.module_left(self._stack[-1] if self._stack else None)

    def _path_of(self, module: Any) -> str:
        """`<k>.sub.path` inside the newest live root that holds it, or a new root `<k>`."""
        entries = self._paths.get(id(module))
        if entries is not None:
            roots = self._roots
            for module_ref, index, path in reversed(entries):
                root = roots.get(index)
                if module_ref() is module and root is not None and root[0]() is not None:
                    return path
        return self._new_root(module)

    def _new_root(self, module: Any) -> str:
        """Index every submodule of a new outermost module once (paths by identity)."""
        if len(self._roots) >= self._sweep_at:
            self._sweep()
        index = self._next_root
        self._next_root += 1
        prefix = f"<{index}>"
        paths, writer, ids = self._paths, self._writer, []
        for name, sub in module.named_modules():
            path = f"{prefix}.{name}" if name else prefix
            writer.module_type(path, type(sub).__name__)  # containers never called need it too
            paths.setdefault(id(sub), []).append((weakref.ref(sub), index, path))
            ids.append(id(sub))
        self._roots[index] = (weakref.ref(module), ids)
        return prefix

    def _sweep(self) -> None:
        """Drop dead roots and their entries (a loss module made in every forward is a new root
        each step): run when the roots held double, so a call's cost stays flat."""
        roots, paths = self._roots, self._paths
        touched: set[int] = set()
        for index in [i for i, (root_ref, _) in roots.items() if root_ref() is None]:
            touched.update(roots.pop(index)[1])
        for key in touched:
            kept = [entry for entry in paths[key] if entry[1] in roots]
            if kept:
                paths[key] = kept
            else:
                del paths[key]
        self._sweep_at = max(_FIRST_SWEEP, 2 * len(roots))

    def root_placeholders(self) -> dict[str, Any]:
        """`<k>` -> the root module still alive (for naming), by placeholder."""
        found = {}
        for index, (root_ref, _) in self._roots.items():
            root = root_ref()
            if root is not None:
                found[f"<{index}>"] = root
        return found
