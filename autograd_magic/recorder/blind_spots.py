"""What the recorder does where it cannot see: `torch.from_numpy` made outside function modes,
user saved-tensor hooks that hide saved tensors, and places PyTorch allows no tracking
(`suspend`/`resume`), each noted once per line as a blind spot (`Recorder` inherits it)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import torch

from autograd_magic.model.records import Blindspot, BlindspotKind, Site
from autograd_magic.recorder import stacks
from autograd_magic.recorder.ops import OpKind

if TYPE_CHECKING:
    from autograd_magic.recorder.aliases import AliasTracker
    from autograd_magic.recorder.mode import RecorderMode
    from autograd_magic.recorder.sites import SiteFinder
    from autograd_magic.recorder.writer import TraceWriter

_HOOKS_MESSAGE = (
    "Your own saved-tensor hooks (torch.utils.checkpoint, save_on_cpu, ...) were active at line "
    "{line}: tensors saved under them are handled by your hooks and not counted here."
)


class BlindSpotHandling:
    """Mixin of `Recorder`: from_numpy links and blind spots (state set by its `__init__`)."""

    writer: TraceWriter
    aliases: AliasTracker
    _sites: SiteFinder
    _thread: int
    _busy: int
    _mode: RecorderMode | None
    _suspended: str | None
    _blind_lines: set[tuple[str, int]]
    _pack_hook: Any
    _unpack: Any

    def from_numpy_made(self, tensor: torch.Tensor, array: Any) -> None:
        """`torch.from_numpy(array)` returned `tensor` while this block was active."""
        if threading.get_ident() != self._thread:  # the patch is global; the block is not
            return
        self._busy += 1
        try:
            self.aliases.link(tensor, array, "from_numpy", OpKind.AS_TENSOR)
        finally:
            self._busy -= 1

    def forget(self, obj: Any) -> None:
        """Hold no weak reference to `obj` any more (before `torch.utils.swap_tensors`)."""
        self.aliases.registry.forget(obj)

    def user_hooks_entered(self) -> None:
        """User saved-tensor hooks were entered: they hide saved tensors from this block."""
        if threading.get_ident() != self._thread:  # hooks are per thread: not this block's
            return
        site = self._sites.here()
        self._note_blindspot("saved-tensor-hooks", site, _HOOKS_MESSAGE)

    def suspend(self, kind: BlindspotKind, message: str) -> bool:
        """Step aside (hooks; the mode too unless only hooks are refused) where PyTorch allows no
        tracking; False when this block is not running on this thread."""
        if self._mode is None or threading.get_ident() != self._thread or self._suspended:
            return False
        self._note_blindspot(kind, self._sites.here(), message)
        self._suspended = "hooks" if kind == "hooks-disabled" else "all"
        stacks.remove_hooks(self._pack_hook)
        if self._suspended == "all":
            stacks.remove_mode(self._mode)
        return True

    def resume(self) -> None:
        """Undo `suspend` (nothing once the block has ended)."""
        suspended, self._suspended = self._suspended, None
        if self._mode is None or suspended is None:
            return
        stacks.push_hooks(self._pack_hook, self._unpack)
        if suspended == "all":
            stacks.push_mode_innermost(self._mode)

    def _note_blindspot(self, kind: BlindspotKind, site: Site, message: str) -> None:
        if (kind, site.line) in self._blind_lines:
            return
        self._blind_lines.add((kind, site.line))
        self.writer.blindspot(Blindspot(kind, message.format(line=site.line), site.line))
