"""The user's names for what a block recorded, found when it ends: each tracked tensor or array
still alive is named by the shortest path to it in the user's namespace (`model.fc.weight`,
`losses[3]`), saved tensors still held by the name of what holds their storage.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import torch

from autograd_magic.model.disjoint_sets import DisjointSets
from autograd_magic.model.records import AliasLink, Blindspot
from autograd_magic.recorder.naming import find_names, resolve_param_marks
from autograd_magic.recorder.ops import VERSION_SHARING_HOWS
from autograd_magic.recorder.saved import storage_of

if TYPE_CHECKING:
    from autograd_magic.recorder.identity import ObjectRegistry
    from autograd_magic.recorder.writer import TraceWriter


def resolve_labels(
    writer: TraceWriter,
    registry: ObjectRegistry,
    namespace: dict[str, Any],
    budget_s: float,
    also: Callable[[Any, str], None] | None = None,
    extra: dict[int, int] | None = None,
    also_wants: Callable[[torch.Tensor], bool] | None = None,
    ignore: Collection[str] = (),
) -> dict[int, str]:
    """Replace op labels by the user's variable paths for objects still alive; `extra`
    (address -> negative id) asks for more objects' paths in the same walk, `also(obj,
    path)` sees each object visited (`also_wants(tensor)` False: `also` does nothing for that
    plain tensor); names in `ignore` are not walked. Returns every path found by id."""
    alive = registry.alive()
    skipped: set[str] = set()
    param_names: dict[int, str] = {}
    # Held saved tensors by storage: their storage cannot have been reused while held. A
    # released one is named only after a parameter: its storage lives as long as it does.
    held = {b.storage_key for b in writer.trace.buffers if not b.freed and b.storage_key}
    released = {b.storage_key for b in writer.trace.buffers if b.freed and b.storage_key}
    storage_names: dict[int, tuple[str, tuple[int, ...]]] = {}
    param_storage_names: dict[int, tuple[str, tuple[int, ...]]] = {}

    def visit(obj: Any, path: str) -> None:
        if issubclass(type(obj), torch.Tensor) and "\x00" not in path:
            is_param = issubclass(type(obj), torch.nn.Parameter)
            if is_param:
                param_names.setdefault(id(obj), path)
            if held or (is_param and released):
                key = storage_of(obj)[0]
                if key in held:
                    storage_names.setdefault(key, (path, tuple(obj.shape)))
                if is_param and key in released:
                    param_storage_names.setdefault(key, (path, tuple(obj.shape)))
        if also is not None:
            also(obj, path)

    def visit_wants(tensor: torch.Tensor) -> bool:
        """Whether `visit` can note anything for a plain tensor (not a Parameter)."""
        return bool(held) or (also is not None and (also_wants is None or also_wants(tensor)))

    wanted = {**alive, **extra} if extra else alive
    if wanted or also is not None or released:
        names, complete = find_names(
            namespace, wanted, budget_s, visit, skipped, visit_wants, ignore
        )
    else:  # nothing alive to name, no holder to look for, no parameter saved: no walk
        names, complete = {}, True
    names = {uid: resolve_param_marks(path, param_names) for uid, path in names.items()}
    named: dict[int, str] = {}
    for b in writer.trace.buffers:
        found = (param_storage_names if b.freed else storage_names).get(b.storage_key)
        if found is not None:
            named[b.id] = _saved_name(b.shape, *found)
    writer.end.buffer_names(named)
    labels = {
        uid: names.get(uid, registry.op_labels.get(uid, label))
        for uid, label in writer.trace.labels.items()
    }
    writer.end.names(labels, set(alive.values()), _version_groups(writer.trace.links))
    if skipped:
        kinds = ", ".join(sorted(skipped)[:5])
        writer.blindspot(
            Blindspot(
                "naming-skipped",
                f"Variable names were not looked up inside objects of type {kinds}: reading "
                "them would run their own code.",
            )
        )
    if not complete:
        writer.blindspot(
            Blindspot(
                "naming-cut",
                "Looking up variable names ran out of time; some "
                "tensors keep op labels like exp#3.",
            )
        )
    return names


def _saved_name(saved_shape: tuple[int, ...], path: str, shape: tuple[int, ...]) -> str:
    """`w`, or `view of w` when autograd saved a reshaped view of it (addmm saves `w.t()`)."""
    return path if saved_shape == shape else f"view of {path}"


def _version_groups(links: list[AliasLink]) -> dict[int, list[int]]:
    """uid -> every uid sharing its version counter (detach and views do; .data, NumPy do not)."""
    sets = DisjointSets()
    for link in links:
        if link.shares and link.how in VERSION_SHARING_HOWS:
            sets.join(link.member, link.source)
    return {uid: members for members in sets.groups().values() for uid in members}
