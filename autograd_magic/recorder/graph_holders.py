"""Which of the user's names hold a live graph root (`losses[2]`, `crit.loss`): found in the
walk that names tensors when the block ends, and, while it runs, in a short walk at each live
refresh so a provisional finding can say what keeps the graphs (`history`)."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from autograd_magic.model.records import Holder
from autograd_magic.recorder import torch_api
from autograd_magic.recorder.naming import frame_namespace, walk_namespace
from autograd_magic.recorder.nodes import grad_fn_of

if TYPE_CHECKING:
    from autograd_magic.recorder.state import BlockState

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


class LiveHolders:
    """The live refresh's short walk for holders of one block's graphs."""

    def __init__(self, state: BlockState) -> None:
        self.state = state

    def read(self) -> None:
        """Holders of live graph roots now, in the namespace the block was given (the magic's
        cell namespace) or the one of the code running the block, within a few milliseconds;
        provisional until the block ends."""
        state = self.state
        if state.trace.live_nodes == 0:
            return
        namespace = state.namespace if state.namespace is not None else self._home_namespace()
        if namespace is None:
            return
        holders: list[Holder] = []
        with torch_api.DisableTorchFunction():  # reading grad_fn must reach no user mode
            walk_namespace(
                namespace,
                noting_holders(state.key, holders),
                budget_s=LIVE_BUDGET_S,
                worth=has_graph,  # a dataset's tensors hold no graph: not visited
                ignore=state.ignore_names,
            )
        state.writer.end.holders(holders)

    def _home_namespace(self) -> dict[str, Any] | None:
        """The globals and locals of the frame running the block (a refresh runs inside one of
        its torch calls, so that frame is on the stack)."""
        home = self.state.home_code
        frame: FrameType | None = sys._getframe()
        while frame is not None and frame.f_code is not home:
            frame = frame.f_back
        try:
            return None if frame is None else frame_namespace(frame)
        finally:
            del frame
