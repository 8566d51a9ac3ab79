"""Renderers only lower a `Report`: given a small report built by hand (no trace, no analysis),
the text renderer gives exactly this text and the HTML renderer these pieces."""

from __future__ import annotations

import dataclasses

from autograd_magic.model.records import Snapshot
from autograd_magic.report.model import (
    GraphSection,
    GraphView,
    Report,
    Section,
    SectionId,
    Sentence,
    Status,
    Table,
    TableId,
    Timeline,
)
from autograd_magic.views.html import FLAG_STYLE, page, status_html
from autograd_magic.views.text import render_text

TABLES = {
    TableId.MODULES: Table("Memory by module", (), ()),
    TableId.GRAPH: Table("Graph (every op)", ("box", "nodes"), (("MulBackward0 (line 2)", "1"),)),
    TableId.BUFFER_TOTALS: Table("Totals by state", ("state", "tensors"), (("held", "1"),)),
    TableId.BUFFERS: Table("Saved tensors", ("node", "bytes"), (("MulBackward0#1", "12 B"),)),
    TableId.STORAGE: Table("Storage groups", (), ()),
    TableId.VERSIONS: Table(
        "Version bumps",
        ("tensor", "warning"),
        (("x", ""), ("w", "BYPASS")),
        "Showing the first 2 of 3 rows.",
        flag=1,
    ),
}


def small_report(state: str = "finished", nodes: int = 1) -> Report:
    sections = (
        Section(SectionId.TIMELINE, 1, ()),
        Section(SectionId.MODULES, 0, (TableId.MODULES,)),
        Section(SectionId.GRAPH, nodes, ()),
        Section(SectionId.BUFFERS, 1, (TableId.BUFFER_TOTALS, TableId.BUFFERS)),
        Section(SectionId.STORAGE, 0, (TableId.STORAGE,)),
        Section(SectionId.VERSIONS, 3, (TableId.VERSIONS,)),
    )
    view = GraphView([], [], nodes)
    return Report(
        status=Status(state),
        snapshot=Snapshot(1, 12, 2, 24, 2, 1),
        summary=(("Live autograd nodes", "1 now / 2 peak"), ("Backward calls", "1")),
        findings=(),
        sentences=(Sentence("Line 3: `losses` keeps 2 graphs.", 3, "finding"),),
        backward_calls=(Sentence("Line 4: backward() released 1 saved tensor.", 4, "note"),),
        timeline=Timeline([], [], None, ""),
        graph=GraphSection(lambda depth: view, lambda v, i: None),  # type: ignore[arg-type, return-value]
        error=None,
        live_rows=None,
        build_sections=lambda: sections,
        build_table=TABLES.__getitem__,
    )


def test_the_text_report_lowers_the_report_exactly():
    """GIVEN a hand-built report WHEN rendered as text THEN every part appears, in order."""
    assert render_text(small_report()) == (
        "autograd_magic trace (finished)\n"
        "\n"
        "  Live autograd nodes: 1 now / 2 peak\n"
        "  Backward calls: 1\n"
        "\n"
        "Findings:\n"
        "  - Line 3: `losses` keeps 2 graphs.\n"
        "\n"
        "Backward calls:\n"
        "  - Line 4: backward() released 1 saved tensor.\n"
        "\n"
        "Memory by module: none\n"
        "\n"
        "Graph (every op):\n"
        "  box                    nodes\n"
        "  MulBackward0 (line 2)  1\n"
        "\n"
        "Totals by state:\n"
        "  state  tensors\n"
        "  held   1\n"
        "\n"
        "Saved tensors:\n"
        "  node            bytes\n"
        "  MulBackward0#1  12 B\n"
        "\n"
        "Storage groups: none\n"
        "\n"
        "Version bumps:\n"
        "  tensor  warning\n"
        "  x\n"
        "  w       BYPASS\n"
        "  (Showing the first 2 of 3 rows.)\n"
    )


def test_the_text_report_leaves_out_the_graph_table_without_nodes_and_tables_on_request():
    """GIVEN a report of a block that made no node THEN no graph table; with tables=False only
    the summary, sentences and backward calls."""
    assert "Graph (every op)" not in render_text(small_report(nodes=0))
    short = render_text(small_report(), tables=False)
    assert short.endswith("  - Line 4: backward() released 1 saved tensor.\n")
    assert "Saved tensors" not in short


def test_the_html_page_lowers_the_same_report():
    """GIVEN the same report WHEN lowered to HTML THEN it holds the same sentences and tables,
    the table's flagged row marked, and no table while the block runs."""
    html = page(small_report())
    for text in ("`losses` keeps 2 graphs.", "MulBackward0#1", "Showing the first 2 of 3 rows."):
        assert text in html
    assert html.count(FLAG_STYLE) == 2  # both cells of the BYPASS row, no other
    running = page(dataclasses.replace(small_report(), status=Status("running", last_line=7)))
    assert "Saved tensors" not in running
    assert "running, last event at line 7" in status_html(Status("running", last_line=7))
