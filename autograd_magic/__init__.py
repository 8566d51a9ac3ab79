"""autograd_magic: see what PyTorch autograd does with memory, in Jupyter and in scripts.

`%load_ext autograd_magic` registers the `%%trackgraph` cell magic; `autograd_magic.track()` is
the same recorder as a context manager; `autograd_magic.watch()` counts every step cheaply and
records in full only the steps that explain a problem.
"""

from __future__ import annotations

from typing import Any

from autograd_magic.api import track, uninstall
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
from autograd_magic.recorder.core import Recorder
from autograd_magic.trace import Trace
from autograd_magic.watch_trace import WatchTrace
from autograd_magic.watching import watch

__version__ = "0.1.0"


def show(*traces: Trace, names: list[str] | None = None) -> None:
    """Display finished traces: one as its panel, several side by side (peaks, findings per
    trace). Outside IPython, prints the text report."""
    from autograd_magic.display import show as show_traces

    show_traces(traces, names)


def last_trace() -> Trace | None:
    """The trace recorded by the most recent `%%trackgraph` cell, if any."""
    import sys

    magic = sys.modules.get("autograd_magic.magic")  # no cell ran if the magic never loaded
    return None if magic is None else magic.last_trace()


def load_ipython_extension(ipython: Any) -> None:
    """Register `%%trackgraph` (called by `%load_ext autograd_magic`)."""
    from autograd_magic.magic import load

    load(ipython)


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
    "WatchTrace",
    "last_trace",
    "show",
    "track",
    "uninstall",
    "watch",
]
