"""Trace files: `track(save=...)` writes one when its block ends, and the command line reads them.

A saved file is the JSON export (`Trace.to_json`) with a `run` object in front (rank, world size,
pid, program), which `Trace.from_json` ignores and reports use to name traces. Paths may contain
`{rank}` and `{pid}`. Saving never raises: a failure is a warning, so the user's own result or
exception is what they see.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from autograd_magic.model.export import FORMAT, FORMAT_VERSION
from autograd_magic.trace import Trace
from autograd_magic.watch_trace import WATCH_VERSION, WatchTrace


class TraceFileError(Exception):
    """A file that cannot be read as a trace; the message is one line for the user."""


def rank_and_world() -> tuple[int, int]:
    """The torch.distributed rank and world size; torchrun's RANK/WORLD_SIZE when no process
    group is up (before init, or after destroy_process_group); (0, 1) otherwise."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # a broken distributed setup must not stop the save
        pass
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1


def expand_path(template: str | os.PathLike[str], rank: int | None = None) -> Path:
    """`template` with `{rank}` and `{pid}` filled in."""
    if rank is None:
        rank = rank_and_world()[0]
    text = os.fspath(template)
    return Path(text.replace("{rank}", str(rank)).replace("{pid}", str(os.getpid())))


def run_info() -> dict[str, Any]:
    """Who wrote a trace file: rank, world size, pid and the program's argv."""
    rank, world = rank_and_world()
    return {"rank": rank, "world_size": world, "pid": os.getpid(), "argv": list(sys.argv)}


def trace_file_text(trace: Trace | WatchTrace, run: dict[str, Any] | None = None) -> str:
    """The file contents: the export with a leading `run` object (no re-encoding of records)."""
    document = trace.to_json()
    head = json.dumps({"run": run if run is not None else run_info()})
    return head[:-1] + ", " + document[1:]


def save_trace(trace: Trace | WatchTrace, template: str | os.PathLike[str]) -> Path | None:
    """Write `trace` to `template` (parents created); the path, or None after a warning."""
    try:
        run = run_info()
        path = expand_path(template, run["rank"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(trace_file_text(trace, run), encoding="utf-8")
        return path
    except Exception as error:
        warnings.warn(
            f"autograd_magic could not save the trace to {os.fspath(template)!r}: {error}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def load_trace_file(path: str | os.PathLike[str]) -> tuple[Trace | WatchTrace, dict[str, Any]]:
    """The trace (or watch) in a file and its `run` object ({} when absent); TraceFileError
    says why not."""
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceFileError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise TraceFileError(f"{name}: is a folder, not a trace file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TraceFileError(f"{name}: cannot be read ({error})") from None
    if not text.strip():
        raise TraceFileError(f"{name}: empty file ({len(text.encode())} bytes), not a trace")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise TraceFileError(f"{name}: {_json_problem(text, error)}") from None
    except ValueError:
        document = None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TraceFileError(f"{name}: not an autograd_magic trace (no '{FORMAT}' JSON)")
    version = document.get("version")
    watched = document.get("kind") == "watch"
    newest = WATCH_VERSION if watched else FORMAT_VERSION
    if isinstance(version, int) and version > newest:
        raise TraceFileError(
            f"{name}: written by a newer autograd_magic (trace format {version}; "
            f"this version reads format {newest}): upgrade autograd_magic to read it"
        )
    try:
        trace = WatchTrace.from_json(text) if watched else Trace.from_json(text)
    except (ValueError, KeyError, TypeError) as error:
        raise TraceFileError(f"{name}: not a readable autograd_magic trace ({error})") from None
    run = document.get("run")
    return trace, run if isinstance(run, dict) else {}


def _json_problem(text: str, error: json.JSONDecodeError) -> str:
    """What is wrong with a file that is not JSON: cut off, or broken at a place."""
    if _ends_inside_a_value(text):
        size = len(text.encode())
        return f"cut off at byte {size:,}: the JSON ends before the trace does (truncated file?)"
    place = f"line {error.lineno}, column {error.colno}"
    return f"not an autograd_magic trace (not JSON: {error.msg} at {place})"


def _ends_inside_a_value(text: str) -> bool:
    """True when `text` stops inside a string or an open object or list (only called on error)."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
    return in_string or depth > 0
