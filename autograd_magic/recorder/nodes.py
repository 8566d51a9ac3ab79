"""Autograd nodes of a block: tagged through `node.metadata`, recorded as they are born.

A node cannot be weakly referenced and a strong reference would keep its graph alive, so each new
node gets a `NodeTag` in its metadata dict; the tag dies with the C++ node and reports that death.
`NodeFinder` is the part of the recorder that finds new nodes after each op and gives them the
saved buffers packed during it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from autograd_magic.model.records import BlindspotKind, Site
from autograd_magic.model.units import ACCUMULATE_GRAD
from autograd_magic.recorder import native, torch_api
from autograd_magic.recorder.deferred import finalizer, hold
from autograd_magic.recorder.saved import may_own_saved, probe_saved
from autograd_magic.recorder.state import BlockState
from autograd_magic.recorder.torch_api import node_sequence_nr
from autograd_magic.recorder.writer import NODES_CREATED, TraceWriter


class NodeTag(tuple):
    """Stored in `node.metadata`; released exactly when the C++ node is destroyed.

    A tuple `(writer_ref, node_id)`: made by tuple's own constructor, with no Python `__init__`
    to run per node. The writer is weakly held: once the block is over and the recorder gone,
    a dying node reports to no one.
    """

    __slots__ = ()

    @property
    def node_id(self) -> int:
        return self[1]

    @finalizer
    def __del__(self) -> None:
        writer = self[0]()
        if writer is not None:
            # As PackedSaved.__del__: never raise, hold an interrupt (see deferred).
            try:
                writer.node_died(self[1])
            except Exception:
                pass
            except BaseException as error:
                hold(error)


@finalizer
def report_node_death(writer_ref: weakref.ref[TraceWriter], node_id: int) -> None:
    """What the compiled tag (`_native.NodeTag`) calls when its node is destroyed."""
    writer = writer_ref()
    if writer is not None:
        try:  # as NodeTag.__del__
            writer.node_died(node_id)
        except Exception:
            pass
        except BaseException as error:
            hold(error)


def _python_tag(writer_ref: weakref.ref[TraceWriter], node_id: int) -> Any:
    return NodeTag((writer_ref, node_id))


if native.NATIVE is not None:
    native.NATIVE.set_death_reporter(report_node_death)


def tag_maker() -> Callable[[weakref.ref[TraceWriter], int], Any]:
    """`make(writer_ref, node_id)` for a new block: the compiled tag, which the cycle collector
    does not track (see _native.c), or the pure-Python one, which it does."""
    return _python_tag if native.NATIVE is None else native.NATIVE.node_tag


class NodeFinder:
    """Tags the nodes each op makes and gives them the buffers the op saved."""

    def __init__(
        self,
        state: BlockState,
        note_blindspot: Callable[[BlindspotKind, Site, str], None],
        unpack: Callable[[Any], torch.Tensor],
    ) -> None:
        self.state = state
        # Never reassigned for a block: held here too, read on every op.
        self.writer, self.key, self.sites = state.writer, state.key, state.sites
        self._note_blindspot = note_blindspot
        self._unpack = unpack  # our unpack hook, which a probe of saved attributes runs
        self._next_node_id = 1
        self._new_tag = tag_maker()

    def root_node_ids(self, roots: list[torch.Tensor]) -> list[int]:
        """The recorded node ids of the roots' `grad_fn`s (recording any not seen yet)."""
        self.register_outputs(roots, len(self.state.unowned))
        key, ids = self.key, []
        for tensor in roots:
            grad_fn: Any = tensor.grad_fn
            tag = None if grad_fn is None else grad_fn.metadata.get(key)
            if tag is not None:
                ids.append(tag.node_id)
        return ids

    def register_outputs(self, out: Any, mark: int) -> None:
        """Tag the nodes behind an op's output(s) that this block has not seen (`mark`: how many
        buffers were unowned when the op began)."""
        key = self.key
        if isinstance(out, torch.Tensor):
            grad_fn = grad_fn_of(out)
            if grad_fn is not None:
                metadata = grad_fn.metadata
                if key not in metadata and not self.born_alone(grad_fn, metadata, mark):
                    self.discover([grad_fn], mark)
            return
        if isinstance(out, (tuple, list)):
            roots = []
            for item in out:
                if isinstance(item, torch.Tensor):
                    grad_fn = grad_fn_of(item)
                    if grad_fn is not None and key not in grad_fn.metadata:
                        roots.append(grad_fn)
            if roots:
                self.discover(roots, mark)

    def born_alone(self, node: Any, metadata: dict, mark: int) -> bool:
        """Fast path for the common op: one new node whose inputs' nodes are all known."""
        key = self.key
        next_ids = []
        for child, _ in node.next_functions:
            if child is not None:
                tag = child.metadata.get(key)
                if tag is None:
                    return False
                next_ids.append(tag[1])
        node_id = self._next_node_id
        self._next_node_id = node_id + 1
        state = self.state
        metadata[key] = self._new_tag(state.writer_ref, node_id)
        site = state.call_site or self.sites.here()
        writer = self.writer
        writer.node_born(node_id, type(node).__name__, site, False, tuple(next_ids), True)
        unowned = state.unowned
        if unowned:
            if mark == 0:
                # Everything saved during this op, and one new node (an op's output node is
                # never AccumulateGrad): it owns them all, as `_assign_buffers` would decide.
                writer.buffers_owned(unowned, node_id)
                unowned.clear()
            else:
                self._assign_buffers([(node, node_id, None)], mark, site)
        return True

    def discover(self, roots: list[Any], mark: int) -> None:
        """Tag every node reachable from `roots` that this trace has not seen; assign buffers."""
        writer, state = self.writer, self.state
        key, writer_ref, new_tag = self.key, state.writer_ref, self._new_tag
        stack, found = list(roots), []
        while stack:
            node = stack.pop()
            metadata = node.metadata
            if key in metadata:
                continue
            node_id = self._next_node_id
            self._next_node_id += 1
            metadata[key] = new_tag(writer_ref, node_id)
            next_functions = node.next_functions
            found.append((node, node_id, next_functions))
            for child, _ in next_functions:
                if child is not None:
                    stack.append(child)
        site = state.call_site or self.sites.here()
        writer.next_seq()
        root_ids = {id(root) for root in roots}
        for node, node_id, next_functions in found:
            name = type(node).__name__
            # An op's own output node is new; only deeper nodes may predate the block.
            existed = (
                id(node) not in root_ids
                and name != ACCUMULATE_GRAD
                and node_sequence_nr(node) < state.sequence_start
            )
            next_ids = tuple(
                [child.metadata[key][1] for child, _ in next_functions if child is not None]
            )
            writer.node_born(node_id, name, site, existed, next_ids)
            if name == "CompiledFunctionBackward":
                self._note_blindspot("compiled", site, _COMPILED_MESSAGE)
        writer.sample(NODES_CREATED, site)
        if state.unowned:
            self._assign_buffers(found, mark, site)

    def _assign_buffers(self, found: list[tuple[Any, int, Any]], mark: int, site: Site) -> None:
        state = self.state
        unowned = state.unowned
        if len(unowned) == mark and not torch_api.TELLS_WHO_PACKED:
            # Our pack hook saw nothing of this op: its saved tensors, if any, are another hook's
            # (a checkpoint's), and on torch 2.4 a probe could run that hook's unpack.
            return
        # Only a node that may save can own buffers (not AccumulateGrad, nor the TBackward0
        # that F.linear makes beside its AddmmBackward0): where one node of the op may, it owns
        # all the op saved, as for an op that made one node.
        nodes = [(n, i) for n, i, _ in found if may_own_saved(type(n))]
        if mark == 0 and len(nodes) == 1:
            self.writer.buffers_owned(unowned, nodes[0][1])
            unowned.clear()
            return
        owned: set[int] = set()
        state.busy += 1
        try:
            for node, node_id in nodes:
                state.probe_hits = hits = list[int]()
                probe_saved(node, self._unpack)
                self.writer.buffers_owned(hits, node_id)
                owned.update(hits)
        finally:
            state.probe_hits = None
            state.busy -= 1
        unowned[:] = [b for b in unowned if b not in owned][-1000:]


_COMPILED_MESSAGE = (
    "Code compiled with torch.compile ran at line {line}: its inner operations and the tensors "
    "it saves are hidden inside one CompiledFunctionBackward node."
)


def grad_fn_of(tensor: torch.Tensor) -> Any:
    """`tensor.grad_fn`, or None where PyTorch refuses to read it: a view made under no_grad and
    then written in place (`Embedding(padding_idx=...)` does that to its weight). Reading it
    raises, and the user's own code never reads it. (Any: `metadata` is a dict, not a method.)"""
    try:
        return tensor.grad_fn
    except RuntimeError:
        return None


# PyTorch's own read of the thread's counter (`at::sequence_number::peek`).
_peek_sequence_nr = torch_api.current_sequence_nr_peek


def current_sequence_nr() -> int:
    """The autograd sequence number the next node on this thread will get.

    Read from PyTorch's counter where it exposes it; else a probe node takes the number (and
    the next node gets the one after, as any node the user made would). The probe is invisible
    to the user's function and dispatch modes and runs outside inference mode (where it would
    make no node)."""
    if _peek_sequence_nr is not None:
        return _peek_sequence_nr()
    if (
        torch_api.torch_dispatch_depth() == 0
        and torch.is_grad_enabled()
        and not torch.is_inference_mode_enabled()
    ):
        # The common case, without the context managers it does not need (~35 us per block).
        with torch_api.DisableTorchFunction():
            probe: Any = torch.zeros((), requires_grad=True).mul(1)
            return node_sequence_nr(probe.grad_fn)
    with (
        torch_api.DisableTorchFunction(),
        torch_api.disable_current_modes(),
        torch.inference_mode(False),
        torch.enable_grad(),
    ):
        probe = torch.zeros((), requires_grad=True).mul(1)
        return node_sequence_nr(probe.grad_fn)
