"""`build_report(analysis, options)`: the one `Report` every renderer lowers."""

from __future__ import annotations

from dataclasses import dataclass

from autograd_magic.analysis.layout import DEFAULT_MAX_NODES, GraphView
from autograd_magic.analysis.result import Analysis, analyze
from autograd_magic.model.trace import Trace
from autograd_magic.report.buffers import buffer_table, buffer_totals, storage_table
from autograd_magic.report.graph_table import graph_table
from autograd_magic.report.model import (
    MAX_TABLE_ROWS,
    GraphSection,
    NodeDetails,
    Report,
    Section,
    SectionId,
    Status,
    Table,
    TableId,
    Timeline,
    error_line,
)
from autograd_magic.report.modules import module_table
from autograd_magic.report.sentences import (
    backward_sentences,
    live_timeline_note,
    node_lines,
    sentences,
    summary_items,
    worded_findings,
)
from autograd_magic.report.versions import versions_table


@dataclass(frozen=True)
class ReportOptions:
    """How the report is worded and cut: `block` names the traced code ("cell" in a notebook,
    "block" in a script: the magic decides); `max_nodes` caps the graph's boxes; `live_panel`
    says a live panel beside the static copy lists up to `MAX_TABLE_ROWS` rows."""

    block: str = "block"
    max_nodes: int = DEFAULT_MAX_NODES
    live_panel: bool = False


def build_report(analysis: Analysis, options: ReportOptions | None = None) -> Report:
    """The report of `analysis`: status, summary, sentences, backward calls and timeline now;
    sections, tables and graph views when first read."""
    options = options or ReportOptions()
    trace = analysis.trace

    def table(table_id: TableId) -> Table:
        if table_id is TableId.GRAPH:
            return graph_table(graph.view)
        return _TABLES[table_id](analysis)

    graph = GraphSection(
        view_at=lambda depth: analysis.graph_view(options.max_nodes, depth),
        details_of=lambda view, index: _details(analysis, view, index),
    )
    return Report(
        status=_status(trace),
        snapshot=analysis.snapshot,
        summary=tuple(summary_items(analysis)),
        findings=tuple(worded_findings(analysis)),
        sentences=tuple(sentences(analysis, options.block)),
        backward_calls=tuple(backward_sentences(analysis)),
        timeline=_timeline(analysis),
        graph=graph,
        error=trace.error,
        live_rows=MAX_TABLE_ROWS if options.live_panel else None,
        build_sections=lambda: _sections(analysis),
        build_table=table,
    )


_TABLES = {
    TableId.MODULES: module_table,
    TableId.BUFFER_TOTALS: buffer_totals,
    TableId.BUFFERS: buffer_table,
    TableId.STORAGE: storage_table,
    TableId.VERSIONS: versions_table,
}


def _sections(analysis: Analysis) -> tuple[Section, ...]:
    trace = analysis.trace
    return (
        Section(SectionId.TIMELINE, len(trace.backward_calls), ()),
        Section(SectionId.MODULES, len(analysis.modules), (TableId.MODULES,)),
        Section(SectionId.GRAPH, len(trace.nodes), ()),
        Section(SectionId.BUFFERS, len(trace.buffers), (TableId.BUFFER_TOTALS, TableId.BUFFERS)),
        Section(SectionId.STORAGE, len(analysis.storage_groups), (TableId.STORAGE,)),
        Section(SectionId.VERSIONS, len(trace.version_bumps), (TableId.VERSIONS,)),
    )


def _status(trace: Trace) -> Status:
    if trace.error:
        at = "" if trace.error_site is None else trace.error_site.describe()
        return Status("error", trace.error.split(":", 1)[0], at)
    if trace.finished:
        return Status("finished")
    return Status("running", last_line=trace.timeline[-1].line if trace.timeline else None)


def _timeline(analysis: Analysis) -> Timeline:
    trace = analysis.trace
    line = None
    if trace.error:
        line = error_line(trace.error_site)
        if line is None and trace.timeline:
            line = trace.timeline[-1].line
    note = "" if trace.finished or not trace.timeline else live_timeline_note(analysis)
    return Timeline(trace.timeline, trace.backward_calls, line, note)


def _details(analysis: Analysis, view: GraphView, index: int) -> NodeDetails:
    """One graph box: its label, where its nodes were made and freed, its saved tensors."""
    box = view.boxes[index]
    return NodeDetails(node_lines(analysis, box), buffer_table(analysis, set(box.members)))


def report_of(trace: Trace, options: ReportOptions | None = None) -> Report:
    """The report of `trace` as it is now: `build_report(analyze(trace), options)`."""
    return build_report(analyze(trace), options)
