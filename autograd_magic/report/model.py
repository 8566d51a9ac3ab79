"""`Report`: everything a renderer shows of one trace, as sentences and tables of strings.

Built once by `build_report(analysis, options)`; the text report, the static HTML, the HTML
report, the command line and the widget panel each only lower it, so they always agree. The
panel's tabs are the report's sections by `SectionId`; a table is found by its `TableId`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from autograd_magic.analysis.layout import DEFAULT_MAX_NODES, OPS, Box, GraphView
from autograd_magic.model.records import BackwardCall, Finding, Site, Snapshot, TimelineSample

# The graph's parts are the analysis's layout types, named here for the renderers.
__all__ = [
    "DEFAULT_MAX_NODES",
    "MAX_TABLE_ROWS",
    "OPS",
    "STATIC_TABLE_ROWS",
    "TEXT_TABLE_ROWS",
    "Box",
    "GraphSection",
    "GraphView",
    "NodeDetails",
    "Report",
    "Section",
    "SectionId",
    "Sentence",
    "Status",
    "Table",
    "TableId",
    "Timeline",
    "capped",
    "cut_note",
    "error_line",
]
MAX_TABLE_ROWS = 500  # the widget's tables
TEXT_TABLE_ROWS = 30  # the text report stays a screen or two
STATIC_TABLE_ROWS = 20  # saved notebook outputs stay small; the widget shows more


@dataclass(frozen=True)
class Sentence:
    """One plain sentence for the reader; `kind` is error, finding, blindspot or note."""

    text: str
    line: int | None
    kind: str = "finding"


@dataclass(frozen=True)
class Table:
    """Rows of strings under `headers`; `note` says what was left out, never cut silently;
    rows with a non-empty cell in column `flag` are flagged (warnings)."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""
    flag: int | None = None


def cut_note(count: int, limit: int = MAX_TABLE_ROWS) -> str:
    return f"Showing the first {limit:,} of {count:,} rows." if count > limit else ""


def capped(table: Table, limit: int) -> Table:
    """`table` cut to `limit` rows, its note saying how many rows there were."""
    if len(table.rows) <= limit:
        return table
    note = f"Showing {limit} of {len(table.rows):,} rows. {table.note}".strip()
    return Table(table.title, table.headers, table.rows[:limit], note, table.flag)


class TableId(enum.Enum):
    """The report's tables, in page order."""

    MODULES = "modules"
    GRAPH = "graph"
    BUFFER_TOTALS = "buffer totals"
    BUFFERS = "buffers"
    STORAGE = "storage"
    VERSIONS = "versions"


class SectionId(enum.Enum):
    """The report's sections after the findings: the panel's tabs, in order."""

    TIMELINE = "Timeline"
    MODULES = "Modules"
    GRAPH = "Graph"
    BUFFERS = "Buffers"
    STORAGE = "Storage"
    VERSIONS = "Versions"


@dataclass(frozen=True)
class Section:
    """One section: its title, how many things it lists, and the tables it shows."""

    id: SectionId
    count: int
    tables: tuple[TableId, ...]

    @property
    def title(self) -> str:
        return f"{self.id.value} ({self.count:,})"


@dataclass(frozen=True)
class Status:
    """The report's first line: running (with the last event's line), finished, or stopped by
    an error (its type and where)."""

    state: str  # "running", "finished" or "error"
    error_type: str = ""
    error_where: str = ""
    last_line: int | None = None


@dataclass(frozen=True)
class Timeline:
    """What the timeline figure draws: samples, backward calls, the line of the error that
    stopped the block (None: no error), and the note a live sparkline (no axes) shows."""

    samples: list[TimelineSample]
    backward_calls: list[BackwardCall]
    error_line: int | None
    live_note: str


@dataclass(frozen=True)
class NodeDetails:
    """One graph box: what it is, where its nodes were made and freed, its saved tensors."""

    lines: tuple[str, ...]
    buffers: Table


@dataclass
class GraphSection:
    """The graph at the default depth, and at any other on request (the panel's choice)."""

    view_at: Callable[[int | None], GraphView]
    details_of: Callable[[GraphView, int], NodeDetails]

    @cached_property
    def view(self) -> GraphView:
        """The readable default view."""
        return self.view_at(None)

    @staticmethod
    def note(view: GraphView) -> str:
        """What the picture shows and what was merged."""
        return view.note or f"All {view.total_nodes:,} recorded nodes are shown."


@dataclass
class Report:
    """One trace's report. Sections and tables are built on first read (a live refresh shows
    the numbers and sentences only; a finished panel builds a tab when it is opened)."""

    status: Status
    snapshot: Snapshot
    summary: tuple[tuple[str, str], ...]
    findings: tuple[Finding, ...]  # worded, for comparisons of several traces
    sentences: tuple[Sentence, ...]
    backward_calls: tuple[Sentence, ...]
    timeline: Timeline
    graph: GraphSection
    error: str | None
    live_rows: int | None  # rows a live panel lists (None where there is none: a script)
    build_sections: Callable[[], tuple[Section, ...]] = field(repr=False)
    build_table: Callable[[TableId], Table] = field(repr=False)
    _tables: dict[TableId, Table] = field(default_factory=dict, repr=False)

    @property
    def finished(self) -> bool:
        return self.status.state != "running"

    @cached_property
    def sections(self) -> tuple[Section, ...]:
        """The sections after the findings, in order (the panel's tabs)."""
        return self.build_sections()

    def table(self, table_id: TableId) -> Table:
        """The table `table_id`, built once."""
        if table_id not in self._tables:
            self._tables[table_id] = self.build_table(table_id)
        return self._tables[table_id]

    def section(self, section_id: SectionId) -> Section:
        return next(s for s in self.sections if s.id is section_id)

    def page_tables(self) -> list[Table]:
        """Every table but the graph's, in page order (the static copy's and HTML's)."""
        return [self.table(t) for t in TableId if t is not TableId.GRAPH]


def error_line(site: Site | None) -> int | None:
    """The traced code's line of an error site."""
    return None if site is None else (site.outer_line or site.line)
