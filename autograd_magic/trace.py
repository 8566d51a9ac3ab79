"""`Trace`, as users hold it: the records of one tracked block, plus the reading API.

The model's `Trace` holds records and counters only; this subclass, which `track()` fills,
adds what users read from it (`findings`, `facts`, `modules()`, `storage_groups()`, `graph()`,
`report()`) and the JSON export, each computed from the records when asked. A trace saved as
JSON stores its facts (no words) and the source lines they cite, so that a loaded trace words
its findings as the live one did, in the wording of the autograd_magic that reads it.
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from autograd_magic.analysis.findings import Fact
from autograd_magic.analysis.module_stats import module_stats
from autograd_magic.analysis.result import trace_facts
from autograd_magic.analysis.storage import storage_groups
from autograd_magic.model import records
from autograd_magic.model import trace as model
from autograd_magic.model.export import to_networkx, trace_fields, trace_to_json
from autograd_magic.report.build import ReportOptions, report_of
from autograd_magic.report.model import Report
from autograd_magic.report.wording import finding

if TYPE_CHECKING:
    import networkx

MAX_SOURCE_LINES = 5_000  # a cited file longer than this is not stored in the JSON


class Trace(model.Trace):
    """Everything recorded while a `track()` block ran; usable during and after the block."""

    @property
    def facts(self) -> list[Fact]:
        """The findings as facts (data naming variables and lines); [] while the block runs."""
        return trace_facts(self)

    @property
    def findings(self) -> list[records.Finding]:
        """The findings in words, root cause first; [] while the block runs."""
        if self.stored_findings is not None:  # a file of format 1-3 stored them worded
            return list(self.stored_findings)
        return [finding(fact) for fact in self.facts]

    def modules(self) -> list[records.ModuleStats]:
        """One entry per nn.Module that ran in the block, most saved bytes first."""
        return module_stats(self.nodes, self.buffers, self.module_calls, self.module_types)

    def storage_groups(self) -> list[records.StorageGroup]:
        """Groups of tensors/arrays that share memory, with how each joined and copies beside."""
        return storage_groups(self.links, self.labels, self.alive_at_end)

    def graph(self) -> networkx.DiGraph:
        """The recorded autograd graph; edges point from a node to its `next_functions`."""
        return to_networkx(self.nodes, self.buffers)

    def report(self, block: str = "block") -> Report:
        """The report every view shows (`block`: "cell" names the traced code a cell)."""
        return report_of(self, ReportOptions(block=block))

    def to_json(self) -> str:
        """A complete, versioned JSON export (see `Trace.from_json`)."""
        from autograd_magic.analysis.findings.serial import facts_to_json_list

        facts = facts_to_json_list(self.facts)
        fields = {**vars(self), "retained_bytes": self.retained_bytes}
        return trace_to_json(fields, facts, _cited_sources(facts) | self.sources)

    @classmethod
    def from_json(cls, text: str) -> Trace:
        """Load an export without executing anything; raises ValueError on a bad document."""
        from autograd_magic.analysis.findings.serial import facts_from_json_list

        fields = trace_fields(text)
        if fields.get("stored_facts") is not None:
            facts_from_json_list(fields["stored_facts"])  # a bad fact fails here, not later
        _remember_sources(fields.get("sources", {}))
        trace = cls.from_records(**fields)
        assert isinstance(trace, cls)  # from_records builds the class it is called on
        return trace


def _cited_sources(facts: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The source lines of every file the facts cite, as linecache has them now."""
    out: dict[str, list[str]] = {}
    for file in sorted(set(_files(facts))):
        lines = linecache.getlines(file)
        if lines and len(lines) <= MAX_SOURCE_LINES:
            out[file] = [line.rstrip("\n") for line in lines]
    return out


def _files(value: Any) -> Iterator[str]:
    """The `file` of every site in a JSON value."""
    if isinstance(value, dict):
        if isinstance(value.get("file"), str) and "line" in value:
            yield value["file"]
        for item in value.values():
            yield from _files(item)
    elif isinstance(value, list):
        for item in value:
            yield from _files(item)


def _remember_sources(sources: dict[str, list[str]]) -> None:
    """Give linecache the stored lines of files it cannot read (a notebook cell's code), as
    IPython does for its cells, so the findings quote them."""
    for file, lines in sources.items():
        if not os.path.exists(file) and not linecache.getlines(file):
            text = [line + "\n" for line in lines]
            linecache.cache[file] = (sum(map(len, text)), None, text, file)
