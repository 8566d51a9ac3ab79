"""What the recorder does where it cannot see: `torch.from_numpy` made outside function modes,
user saved-tensor hooks that hide saved tensors, and places PyTorch allows no tracking
(`suspend`/`resume`), each noted once per line as a blind spot. `BlindSpots` is what the shared
patches (`install`) call on each active block."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import torch

from autograd_magic.model.records import Blindspot, BlindspotKind, Site
from autograd_magic.recorder import stacks
from autograd_magic.recorder.ops import OpKind

if TYPE_CHECKING:
    from autograd_magic.recorder.aliases import AliasTracker
    from autograd_magic.recorder.state import BlockState

_HOOKS_MESSAGE = (
    "Your own saved-tensor hooks (torch.utils.checkpoint, save_on_cpu, ...) were active at line "
    "{line}: tensors saved under them are handled by your hooks and not counted here."
)


class BlindSpots:
    """One block's answers to the shared patches (`install.Patched`), and its blind spots."""

    def __init__(self, state: BlockState, aliases: AliasTracker, owner: Any) -> None:
        self.state = state
        self.aliases = aliases
        # The block's recorder, weakly (it holds this object): `install.live_blocks` lists
        # these objects, and `uninstall()` ends their recorders.
        self.owner = weakref.ref(owner)
        self._lines: set[tuple[str, int]] = set()

    def from_numpy_made(self, tensor: torch.Tensor, array: Any) -> None:
        """`torch.from_numpy(array)` returned `tensor` while this block was active."""
        state = self.state
        if threading.get_ident() != state.thread:  # the patch is global; the block is not
            return
        state.busy += 1
        try:
            self.aliases.link(tensor, array, "from_numpy", OpKind.AS_TENSOR)
        finally:
            state.busy -= 1

    def forget(self, obj: Any) -> None:
        """Hold no weak reference to `obj` any more (before `torch.utils.swap_tensors`)."""
        self.aliases.registry.forget(obj)

    def user_hooks_entered(self) -> None:
        """User saved-tensor hooks were entered: they hide saved tensors from this block."""
        if threading.get_ident() != self.state.thread:  # hooks are per thread: not this block's
            return
        self.note("saved-tensor-hooks", self.state.sites.here(), _HOOKS_MESSAGE)

    def suspend(self, kind: BlindspotKind, message: str) -> bool:
        """Step aside (hooks; the mode too unless only hooks are refused) where PyTorch allows no
        tracking; False when this block is not running on this thread."""
        state = self.state
        if state.mode is None or threading.get_ident() != state.thread or state.suspended:
            return False
        self.note(kind, state.sites.here(), message)
        state.suspended = "hooks" if kind == "hooks-disabled" else "all"
        if state.pack is not None:
            stacks.remove_hooks(state.pack)
        if state.suspended == "all":
            stacks.remove_mode(state.mode)
        return True

    def resume(self) -> None:
        """Undo `suspend` (nothing once the block has ended)."""
        state = self.state
        suspended, state.suspended = state.suspended, None
        if state.mode is None or suspended is None:
            return
        if state.pack is not None and state.unpack is not None:
            stacks.push_hooks(state.pack, state.unpack)
        if suspended == "all":
            stacks.push_mode_innermost(state.mode)

    def note(self, kind: BlindspotKind, site: Site, message: str) -> None:
        """A blind spot of `kind` at `site` (once per kind and line); `message` has a {line}."""
        if (kind, site.line) in self._lines:
            return
        self._lines.add((kind, site.line))
        self.state.writer.blindspot(Blindspot(kind, message.format(line=site.line), site.line))
