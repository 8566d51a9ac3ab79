"""`Fact`: one finding as data (what happened, where, how much, what caused it), never words.

The analyses in this package return facts; `autograd_magic.report.wording` turns a fact into the
`Finding` sentence that the trace stores and every view shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autograd_magic.model.records import FindingKind, Site


@dataclass(frozen=True)
class SavedBy:
    """Who saved the tensors a write hit: node names, module paths (layers folded) and lines."""

    owners: tuple[str, ...]
    modules: tuple[str, ...]
    lines: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Fact:
    """One diagnosis. `form` says which of its kind's situations it is (the wording differs);
    `cause` is the root-cause fact this one follows from (None for a root cause or a lone fact).
    `reference` is the line that took the reference (a store, a write, a backward call) and
    `built` the line that built the graph; `detail` holds what only that form needs."""

    kind: FindingKind
    form: str
    line: int | None
    related_lines: tuple[int, ...] = ()
    holder: str | None = None
    nbytes: int = 0  # bytes at stake
    cause: Fact | None = None
    reference: Site | None = None
    built: Site | None = None
    iterations: int = 0  # iterations spanned (0 when not counted)
    node_ids: tuple[int, ...] = ()  # evidence: the node and buffer records behind the fact
    buffer_ids: tuple[int, ...] = ()
    detail: Mapping[str, Any] = field(default_factory=dict)
