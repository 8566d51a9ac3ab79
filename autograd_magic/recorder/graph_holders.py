"""Which of the user's names hold a live graph root (`losses[2]`, `crit.loss`): found in the
walk that names tensors when the block ends, and, while it runs, in a short walk at each live
refresh so a provisional finding can say what keeps the graphs (`history`)."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Collection
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

import torch

from autograd_magic.model.records import Holder
from autograd_magic.recorder import torch_api
from autograd_magic.recorder.naming import frame_namespace, walk_namespace
from autograd_magic.recorder.nodes import grad_fn_of

if TYPE_CHECKING:
    from autograd_magic.recorder.writer import TraceWriter

MAX_PATHS_PER_ROOT = 4
LIVE_BUDGET_S = 0.005  # a live refresh's walk; the end's walk has the block's naming budget


def has_graph(tensor: torch.Tensor) -> bool:
    """True when a tensor has a grad_fn: the only tensors `noting_holders` can note."""
    return grad_fn_of(tensor) is not None


def noting_holders(key: str, holders: list[Holder]) -> Callable[[Any, str], None]:
    """A walk visitor that appends to `holders` each path to a tensor whose graph root this
    block recorded (tagged under `key`), a few paths per root."""
    paths = Counter[int]()

    def note_holder(obj: Any, path: str) -> None:
        grad_fn = grad_fn_of(obj) if issubclass(type(obj), torch.Tensor) else None
        if grad_fn is not None:
            tag = grad_fn.metadata.get(key)
            # A few paths per root: `loss` and `losses[2]` may name the same tensor.
            if tag is not None and paths[tag.node_id] < MAX_PATHS_PER_ROOT:
                paths[tag.node_id] += 1
                holders.append(Holder(path, tag.node_id))

    return note_holder


class LiveHolderReading:
    """Mixin of `Recorder`: the live refresh's short walk (state set by its `__init__`)."""

    writer: TraceWriter
    _key: str
    _namespace: dict[str, Any] | None
    _home_code: CodeType | None
    _ignore_names: Collection[str]

    def read_graph_holders(self) -> None:
        """Holders of live graph roots now, in the namespace the block was given (the magic's
        cell namespace) or the one of the code running the block, within a few milliseconds;
        provisional until the block ends."""
        if self.writer.trace.live_nodes == 0:
            return
        namespace = self._namespace if self._namespace is not None else self._home_namespace()
        if namespace is None:
            return
        holders: list[Holder] = []
        with torch_api.DisableTorchFunction():  # reading grad_fn must reach no user mode
            walk_namespace(
                namespace,
                noting_holders(self._key, holders),
                budget_s=LIVE_BUDGET_S,
                worth=has_graph,  # a dataset's tensors hold no graph: not visited
                ignore=self._ignore_names,
            )
        self.writer.end_holders(holders)

    def _home_namespace(self) -> dict[str, Any] | None:
        """The globals and locals of the frame running the block (a refresh runs inside one of
        its torch calls, so that frame is on the stack)."""
        frame: FrameType | None = sys._getframe()
        while frame is not None and frame.f_code is not self._home_code:
            frame = frame.f_back
        try:
            return None if frame is None else frame_namespace(frame)
        finally:
            del frame
