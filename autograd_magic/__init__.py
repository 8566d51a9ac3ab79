"""autograd_magic: see what PyTorch autograd does with memory, in Jupyter and in scripts.

`%load_ext autograd_magic` registers the `%%trackgraph` cell magic; `autograd_magic.track()` is
the same recorder as a context manager.
"""

from __future__ import annotations

import os
from typing import Any

from autograd_magic.model.records import (
    AliasLink,
    BackwardCall,
    Blindspot,
    Finding,
    NodeRecord,
    SavedBuffer,
    Site,
    Snapshot,
    StorageGroup,
    TimelineSample,
    VersionBump,
)
from autograd_magic.model.trace import Trace
from autograd_magic.recorder.core import Recorder
from autograd_magic.views.wording import analyze

__version__ = "0.1.0"

_last_trace: Trace | None = None


def track(save: str | os.PathLike[str] | None = None, **options: Any) -> Recorder:
    """Record autograd nodes, saved buffers, shared storage and version bumps in a block.

    `with autograd_magic.track() as trace:` yields a `Trace`, usable during and after the block;
    its findings are computed when the block ends. `save="trace.json"` writes the trace when the
    block ends, also after an exception (`{rank}` and `{pid}` are filled in; a failed write is a
    warning). Other options: `trace` (a `Trace` to fill), `home_code`, `namespace` (where to look
    up variable names), `name_budget_s`.
    """
    options.setdefault("analyze", analyze)
    if save is not None:
        from autograd_magic.saving import save_trace

        options["on_exit"] = lambda trace: save_trace(trace, save)
    return Recorder(**options)


def uninstall() -> int:
    """Remove every recorder still installed on this thread: running, left behind by an
    interrupt that landed as a block ended, or by a block that ended on another thread; returns
    how many. Their traces stay unfinished."""
    from autograd_magic.recorder import install
    from autograd_magic.recorder.mode import RecorderMode

    blocks = [
        b for b in install.live_blocks() if isinstance(b, Recorder) and b.began_on_this_thread()
    ]
    for block in blocks:
        block.abandon()
    install.purge_ended_modes(RecorderMode)
    return len(blocks) + install.purge_stranded()


def show(*traces: Trace, names: list[str] | None = None) -> None:
    """Display finished traces: one as its panel, several side by side (peaks, findings per
    trace). Outside IPython, prints the text report."""
    from autograd_magic.display import show as show_traces

    show_traces(traces, names)


def last_trace() -> Trace | None:
    """The trace recorded by the most recent `%%trackgraph` cell, if any."""
    return _last_trace


def load_ipython_extension(ipython: Any) -> None:
    """Register `%%trackgraph` (called by `%load_ext autograd_magic`)."""
    from autograd_magic.display import register_formatters
    from autograd_magic.magic import load

    load(ipython)
    register_formatters(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove `%%trackgraph` (called by `%unload_ext autograd_magic`)."""
    from autograd_magic.magic import unload

    unload(ipython)


def _register_in_running_ipython() -> None:
    """Traces display themselves in an IPython session that imports this package."""
    import sys

    if "IPython" not in sys.modules:
        return
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            from autograd_magic.display import register_formatters

            register_formatters(shell)
    except Exception:  # display is a convenience: never fail the import for it
        pass


_register_in_running_ipython()

__all__ = [
    "AliasLink",
    "BackwardCall",
    "Blindspot",
    "Finding",
    "NodeRecord",
    "Recorder",
    "SavedBuffer",
    "Site",
    "Snapshot",
    "StorageGroup",
    "TimelineSample",
    "Trace",
    "VersionBump",
    "last_trace",
    "show",
    "track",
    "uninstall",
]
