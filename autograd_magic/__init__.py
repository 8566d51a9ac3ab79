"""autograd_magic: see what PyTorch autograd does with memory, in Jupyter and in scripts.

`%load_ext autograd_magic` registers the `%%trackgraph` cell magic; `autograd_magic.track()` is
the same recorder as a context manager.
"""

from __future__ import annotations

from typing import Any

from autograd_magic.analysis.findings import analyze
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

__version__ = "0.1.0"

_last_trace: Trace | None = None


def track(**options: Any) -> Recorder:
    """Record autograd nodes, saved buffers, shared storage and version bumps in a block.

    `with autograd_magic.track() as trace:` yields a `Trace`, usable during and after the block;
    its findings are computed when the block ends. Options: `trace` (a `Trace` to fill),
    `home_code`, `namespace` (where to look up variable names), `name_budget_s`.
    """
    options.setdefault("analyze", analyze)
    return Recorder(**options)


def last_trace() -> Trace | None:
    """The trace recorded by the most recent `%%trackgraph` cell, if any."""
    return _last_trace


def load_ipython_extension(ipython: Any) -> None:
    """Register `%%trackgraph` (called by `%load_ext autograd_magic`)."""
    from autograd_magic.magic import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove `%%trackgraph` (called by `%unload_ext autograd_magic`)."""
    from autograd_magic.magic import unload

    unload(ipython)


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
    "track",
]
