"""The per-call path: what the block's function mode runs for each of the user's torch calls.

One body per kind of call (`general`, and the shortened `plain`, `inplace`, `subclass`), each run
by `mode.RecorderMode` inside the one frame every recorded call shares (the buffers unowned when
the call began, the in-call mark that lets the call's saved buffers and node share one stack
walk, the live listener between two calls). Kept short: it runs once per torch call.
"""

from __future__ import annotations

from types import FunctionType
from typing import TYPE_CHECKING, Any

import torch

from autograd_magic.model.records import Site
from autograd_magic.recorder import torch_api
from autograd_magic.recorder.backward import run_backward
from autograd_magic.recorder.caller import CallerStandIns, StandIn
from autograd_magic.recorder.mode import KINDS
from autograd_magic.recorder.nodes import grad_fn_of
from autograd_magic.recorder.ops import OpKind

if TYPE_CHECKING:
    from autograd_magic.recorder.aliases import AliasTracker
    from autograd_magic.recorder.listening import Listening
    from autograd_magic.recorder.nodes import NodeFinder
    from autograd_magic.recorder.outside import HolderReader
    from autograd_magic.recorder.state import BlockState

_NoSubclassDispatch = torch_api.DisableTorchFunctionSubclass
_NOT_LINKED = frozenset({OpKind.PLAIN, OpKind.INPLACE, OpKind.BACKWARD, OpKind.GRAD})
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_version = torch_api.version_of
_PyFunction = FunctionType


class OpRecording:
    """One block's handling of each torch call (`mode.RecorderMode` calls it)."""

    def __init__(
        self,
        state: BlockState,
        nodes: NodeFinder,
        aliases: AliasTracker,
        holders: HolderReader,
        listening: Listening,
        stand_ins: CallerStandIns,
    ) -> None:
        self.state = state
        self.writer = state.writer  # also what backward recording writes to (BackwardHost)
        self.nodes = nodes
        self.aliases = aliases
        self.holders = holders
        self.listening = listening
        self.stand_ins = stand_ins

    # ----- bodies: (func, args, kwargs, call, mark) -> the call's result ------------------
    def general(self, func: Any, args: tuple, kwargs: dict, call: StandIn, mark: int) -> Any:
        """Any call of a function already classified (the bodies below are this one, shortened
        for their kind); `mark`: how many buffers were unowned when the call began."""
        __tracebackhide__ = True
        kind, name = KINDS[func]
        if kind is OpKind.PLAIN and "out" not in kwargs:
            # A Python function's first call comes here, not to `library`: the same check.
            watched = type(func) is _PyFunction
            inputs, before = self._versions(args, kwargs) if watched else ([], [])
            saved_before = self.writer.trace.buffers_saved
            out = call(func, args, kwargs)
            if inputs:
                self._hidden_writes(func, inputs, before, saved_before)
        elif kind is OpKind.INPLACE or kind is OpKind.PLAIN:
            out = self.aliases.run_inplace(func, name, args, kwargs, call)
        elif kind is OpKind.BACKWARD or kind is OpKind.GRAD:
            out = run_backward(self, func, kind, args, kwargs)
        else:
            out = call(func, args, kwargs)
        # A subclass (an UninitializedParameter too) sees its calls, not our reads.
        with _NoSubclassDispatch():
            if kind not in _NOT_LINKED:  # aliases and copies: the last branch above
                self.aliases.link(out, args[0] if args else kwargs.get("data"), name, kind)
            self.nodes.register_outputs(out, mark)
        return out

    def plain(self, func: Any, args: tuple, kwargs: dict | None, call: StandIn, mark: int) -> Any:
        """The common op (kind PLAIN, no `out=`), kept short: it runs per op."""
        __tracebackhide__ = True
        out = call(func, args, kwargs)
        if type(out) is _Tensor or isinstance(out, _Tensor):
            grad_fn = grad_fn_of(out)
            if grad_fn is not None:
                metadata = grad_fn.metadata
                nodes = self.nodes
                if nodes.key not in metadata and not nodes.born_alone(grad_fn, metadata, mark):
                    nodes.discover([grad_fn], mark)
        elif isinstance(out, (tuple, list)):
            self.nodes.register_outputs(out, mark)
        return out

    def library(self, func: Any, args: tuple, kwargs: dict | None, call: StandIn, mark: int) -> Any:
        """A Python function of kind PLAIN (an `F.*` helper): the plain body, plus the writes its
        body makes where the mode cannot see them (`F.embedding` renormalizes its weight in
        place under max_norm)."""
        __tracebackhide__ = True
        inputs, before = self._versions(args, kwargs)
        if not inputs:
            return self.plain(func, args, kwargs, call, mark)
        saved_before = self.writer.trace.buffers_saved
        out = self.plain(func, args, kwargs, call, mark)
        self._hidden_writes(func, inputs, before, saved_before)
        return out

    def _versions(self, args: tuple, kwargs: dict | None) -> tuple[list[torch.Tensor], list[int]]:
        """The plain tensor arguments of a call and their versions; none while no saved buffer
        is alive (a write breaks a backward only then, so nothing is read)."""
        if self.writer.live_buffers <= 0:
            return [], []
        inputs = _plain_tensors(args, kwargs)
        return inputs, [_version(t) for t in inputs]

    def _hidden_writes(
        self, func: Any, inputs: list[torch.Tensor], before: list[int], saved_before: int
    ) -> None:
        """Record the arguments whose version moved across a call that is no in-place op."""
        for tensor, old in zip(inputs, before, strict=True):
            new = _version(tensor)
            if new != old:
                self.aliases.hidden_write(tensor, KINDS[func][1], old, new, saved_before)

    def inplace(self, func: Any, args: tuple, kwargs: dict, call: StandIn, mark: int) -> Any:
        """A write on plain tensors (kind INPLACE, no `out=`): an optimizer step makes one per
        parameter and state tensor, so it skips the general path's dispatch."""
        __tracebackhide__ = True
        out = self.aliases.run_inplace(func, KINDS[func][1], args, kwargs, call)
        if type(out) is _Tensor or type(out) is _Parameter:
            grad_fn = grad_fn_of(out)
            # Under no_grad (an optimizer) the target keeps its node, or has none.
            if grad_fn is not None and self.nodes.key not in grad_fn.metadata:
                with _NoSubclassDispatch():
                    self.nodes.register_outputs(out, mark)
        else:
            with _NoSubclassDispatch():
                self.nodes.register_outputs(out, mark)
        return out

    def subclass(self, func: Any, args: tuple, kwargs: dict, call: StandIn, mark: int) -> Any:
        """A plain op on a tensor subclass with its own `__torch_function__`: the subclass sees
        the call itself, never the recorder's bookkeeping (run with subclass dispatch off)."""
        __tracebackhide__ = True
        out = call(func, args, kwargs)
        with _NoSubclassDispatch():
            self.nodes.register_outputs(out, mark)
        return out

    def notify_listener(self) -> None:
        """Let the live listener look (busy meanwhile: torch calls it makes are not the user's
        ops)."""
        state = self.state
        state.busy += 1
        try:
            self.listening.notify()
        finally:
            state.busy -= 1

    # ----- what backward recording asks (backward.BackwardHost) -----------------------------
    def site(self) -> Site:
        """The user's source position (`SiteFinder.here`)."""
        return self.state.sites.here()

    def check_numpy_writes(self) -> None:
        """Record NumPy writes made since the last check."""
        self.aliases.check_numpy_writes()

    def root_node_ids(self, roots: list[torch.Tensor]) -> list[int]:
        """The recorded node ids of the roots' `grad_fn`s (recording any not seen yet)."""
        return self.nodes.root_node_ids(roots)

    def read_holders(self) -> None:
        """Ask who holds the saved storages."""
        self.holders.read_holders()


def _plain_tensors(args: tuple, kwargs: dict | None) -> list[torch.Tensor]:
    """The plain tensors and parameters among a call's arguments (not inside containers),
    without inference tensors, which have no version counter."""
    found = [a for a in args if type(a) is _Tensor or type(a) is _Parameter]
    if kwargs:
        found += [v for v in kwargs.values() if type(v) is _Tensor or type(v) is _Parameter]
    return [t for t in found if not t.is_inference()]
