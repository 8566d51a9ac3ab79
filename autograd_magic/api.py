"""The package's functions for scripts and notebooks alike: `track()` and `uninstall()`.

`autograd_magic/__init__.py` re-exports them; the IPython integration (`magic`) and the command
line build on them, so neither imports the package itself.
"""

from __future__ import annotations

import os
from typing import Any

from autograd_magic.recorder.core import Recorder, uninstall_this_thread
from autograd_magic.trace import Trace

# Names in a namespace that are never the user's tensors: the IPython integration adds its own
# (`In`, `Out`, ...) when it loads, so a plain `with track():` in a notebook skips them too.
NOT_USER_NAMES: set[str] = set()


def track(save: str | os.PathLike[str] | None = None, **options: Any) -> Recorder:
    """Record autograd nodes, saved buffers, shared storage and version bumps in a block.

    `with autograd_magic.track() as trace:` yields a `Trace`, usable during and after the block;
    its findings are computed from its records when read. `save="trace.json"` writes the trace
    when the block ends, also after an exception (`{rank}` and `{pid}` are filled in; a failed
    write is a warning). Other options: `trace` (a `Trace` to fill), `home_code`, `namespace`
    (where to look up variable names), `name_budget_s`, `ignore_names` (namespace names that are
    not the user's, left out of the walk that names tensors).
    """
    options.setdefault("trace", Trace())
    options.setdefault("ignore_names", frozenset(NOT_USER_NAMES))
    if save is not None:
        from autograd_magic.saving import save_trace

        options["on_exit"] = lambda trace: save_trace(trace, save)
    return Recorder(**options)


def uninstall() -> int:
    """Remove every recorder still installed on this thread: running, left behind by an
    interrupt that landed as a block ended, or by a block that ended on another thread; returns
    how many. Their traces stay unfinished."""
    return uninstall_this_thread()
