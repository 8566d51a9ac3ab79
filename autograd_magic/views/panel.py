"""`TracePanel`: the ipywidgets 8 view of one `Trace`'s report, live while the cell runs, and
its static HTML/text fallback for frontends without widgets. The only module that imports
ipywidgets.

At each refresh the panel asks for the trace's report and lowers it; its tabs are the report's
sections by id. It reads records only and never holds a user tensor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import ipywidgets as widgets

from autograd_magic.model.trace import Trace
from autograd_magic.model.watch import WatchRecord
from autograd_magic.report.build import ReportOptions, report_of
from autograd_magic.report.model import (
    DEFAULT_MAX_NODES,
    OPS,
    GraphView,
    Report,
    SectionId,
    Timeline,
)
from autograd_magic.report.watch import progress_text
from autograd_magic.views.figures import figure_png, graph_figure, timeline_figure
from autograd_magic.views.html import (
    MUTED_STYLE,
    div,
    page,
    progress_html,
    sentences_html,
    status_html,
    summary_html,
    table_html,
)
from autograd_magic.views.series import sparkline_png
from autograd_magic.views.text import render_text

TIMELINE_COST_GUESS_S = 0.01  # the live sparkline takes milliseconds (the figure, 0.2 s)
NUMBERS_SHARE = 0.25  # of the live budget, for refreshes of the numbers alone
PANEL_CLASS = "autograd-magic-panel"
STATIC_CLASS = "autograd-magic-static"
TABS = tuple(SectionId)  # the tabs, in the report's section order


class TracePanel:
    """Summary, timeline, graph, buffers, storage and versions of a trace, as widgets.

    Each section is an attribute whose `.value` holds what the reader sees, so tests (and
    users) can read it: `status`, `summary`, `findings`, `timeline_note`, `timeline_image`, `calls`,
    `graph_image`, `graph_note`, `depth_select`, `node_select`, `node_details`, `buffers`,
    `storage`, `versions`; `widget` is the whole panel. The graph and the tables of a finished
    trace are built when their tab is first selected (or the static copy is asked for), so the
    cell's end pays for the summary and the timeline only.
    """

    def __init__(
        self,
        trace: Trace,
        max_nodes: int = DEFAULT_MAX_NODES,
        live_budget: float = 0.04,
        block: str = "cell",
    ) -> None:
        self.trace = trace
        self.max_nodes = max_nodes
        self.options = ReportOptions(block=block, max_nodes=max_nodes, live_panel=True)
        self.report: Report  # the trace's report at the last refresh (set by `_render`)
        self.live_budget = live_budget
        self.view: GraphView | None = None
        self.live_renders = 0
        self._closed = False  # set by close(): later live updates do nothing
        self._first_steps_shown = False  # a watch's first window drawn once its steps ended
        self._timeline_png = b""
        self._graph_png = b""
        self._text: str | None = None  # the text report of the finished trace, made once
        self._graph_note = ""
        self._built: set[SectionId] = set()  # lazy sections already filled
        self._started = time.monotonic()
        self._spent_numbers = self._spent_timeline = 0.0
        self._timeline_cost = TIMELINE_COST_GUESS_S  # until one is drawn
        self._drawn = False
        self.companion = False
        html_widget = widgets.HTML
        self.status, self.summary, self.findings = html_widget(), html_widget(), html_widget()
        self.timeline_image = widgets.Image(format="png", layout={"max_width": "100%"})
        self.timeline_note = html_widget()
        self.calls = html_widget()
        self.graph_note = html_widget()
        self.graph_image = widgets.Image(format="png", layout={"max_width": "100%"})
        self.node_select = widgets.Dropdown(
            options=[], value=None, description="Node:", layout={"width": "60%"}
        )
        self.node_details = html_widget()
        self.depth_select = widgets.Dropdown(
            options=[("every op", OPS)], value=OPS, description="Modules:"
        )
        # A section of tables is one HTML widget holding them (tests read `.value`).
        self.tables = {s: html_widget() for s in TABS if s not in _DRAWN}
        self.modules = self.tables[SectionId.MODULES]
        self.buffers = self.tables[SectionId.BUFFERS]
        self.storage = self.tables[SectionId.STORAGE]
        self.versions = self.tables[SectionId.VERSIONS]
        drawn = {
            SectionId.TIMELINE: widgets.VBox([self.timeline_note, self.timeline_image, self.calls]),
            SectionId.GRAPH: widgets.VBox(
                [
                    self.graph_note,
                    self.depth_select,
                    self.graph_image,
                    self.node_select,
                    self.node_details,
                ]
            ),
        }
        self.tabs = widgets.Tab(
            children=[drawn.get(s) or self.tables[s] for s in TABS],
            titles=tuple(s.value for s in TABS),
        )
        self.widget = widgets.VBox([self.status, self.summary, self.findings, self.tabs])
        self.widget.add_class(PANEL_CLASS)  # lets the static copy hide beside a live panel
        self.node_select.observe(self._on_select, names="value")
        self.depth_select.observe(self._on_depth, names="value")
        self.tabs.observe(self._on_tab, names="selected_index")
        self._render(final=trace.finished, timeline=True)

    # ----- updating ---------------------------------------------------------------------
    def live_update(self, trace: Trace) -> None:
        """Listener for `Recorder.listen`: refresh the numbers, and the timeline when affordable.

        All live work is kept to `live_budget` of the cell's run time so far (4%: the rest of the
        5% budget is the listener check on each torch call and the messages). The numbers may
        use a quarter of it and the timeline the rest, so frequent cheap refreshes never starve
        the timeline: it is redrawn mid-cell whenever its last cost fits its share.
        """
        if self._closed:
            return
        start = time.monotonic()
        allowed = self.live_budget * (start - self._started)
        timeline = self._spent_timeline + self._timeline_cost <= allowed * (1 - NUMBERS_SHARE)
        if not timeline and self._spent_numbers > allowed * NUMBERS_SHARE:
            return
        self._render(final=False, timeline=timeline)
        self.live_renders += 1
        spent = time.monotonic() - start
        if timeline:
            self._spent_timeline += spent
        else:
            self._spent_numbers += spent

    def counted_update(self, result: WatchRecord) -> None:
        """Listener for `Watch.listen_steps`: between captures only the status line changes,
        to what the counted steps show so far (the numbers below are the first steps')."""
        if self._closed:
            return
        if not self._first_steps_shown:
            # The first steps may end between two refreshes: show their record once, whole.
            self._first_steps_shown = True
            if result.windows:  # "When the capture of steps 1-20 ended": the cell runs on
                first = result.windows[0].steps_text
                self.options = dataclasses.replace(self.options, block=f"capture of {first}")
            self._render(final=False, timeline=True)
        below = f". Below: {result.windows[0].steps_text}" if result.windows else ""
        self.status.value = progress_html(progress_text(result) + below)

    def finish(self) -> None:
        """Render every section from the finished (or failed) trace."""
        self._render(final=True, timeline=True)

    def _render(self, final: bool, timeline: bool) -> None:
        self.report = report = report_of(self.trace, self.options)
        changes: list[tuple[Any, str, Any]] = [
            (self.status, "value", status_html(report.status)),
            (self.summary, "value", summary_html(report.summary)),
            (self.findings, "value", sentences_html(list(report.sentences), "Findings")),
        ]
        if timeline:
            start = time.monotonic()
            self._timeline_png, note = _timeline_png(report.timeline, live=not final)
            changes.append((self.timeline_note, "value", note))
            if report.timeline.samples:  # the placeholder costs nothing, says nothing of the next
                # The cheapest draw so far: the first pays one-off costs (fonts, caches), and
                # the envelope keeps later draws at a size-independent cost.
                cost = time.monotonic() - start
                self._timeline_cost = min(cost, self._timeline_cost) if self._drawn else cost
                self._drawn = True
            changes.append((self.timeline_image, "value", self._timeline_png))
        # With the numbers, not the picture: a count above must not run ahead of the list.
        calls = sentences_html(list(report.backward_calls), "Backward calls")
        changes.append((self.calls, "value", calls))
        if final:
            changes.extend(self._final_changes())
        self._apply(changes)

    def _final_changes(self) -> list[tuple[Any, str, Any]]:
        self._built.clear()
        self._text = None
        titles = tuple(section.title for section in self.report.sections)
        changes: list[tuple[Any, str, Any]] = [(self.tabs, "titles", titles)]
        if self.tabs.selected_index not in (None, 0):
            changes += self._lazy_changes(TABS[self.tabs.selected_index])
        return changes

    def _lazy_changes(self, section: SectionId) -> list[tuple[Any, str, Any]]:
        """The content of `section` of a finished trace, built on first need."""
        if not self.report.finished or section in self._built:
            return []
        if section is SectionId.GRAPH:
            self._built.add(section)
            return self._graph_changes(None)
        if section in self.tables:
            self._built.add(section)
            tables = self.report.section(section).tables
            value = "".join(table_html(self.report.table(t)) for t in tables)
            return [(self.tables[section], "value", value)]
        return []

    def _graph_changes(self, depth: int | None) -> list[tuple[Any, str, Any]]:
        """The graph at module `depth` (None: the readable default): picture, note, choices."""
        graph = self.report.graph
        self.view = view = graph.view if depth is None else graph.view_at(depth)
        self._graph_png = figure_png(graph_figure(view))
        self._graph_note = graph.note(view)
        depths = [(f"depth {d}", d) for d in range(1, view.max_depth + 1)]
        return [
            (self.graph_image, "value", self._graph_png),
            (self.graph_note, "value", div(html.escape(self._graph_note), MUTED_STYLE)),
            (self.depth_select, "options", [*depths, ("every op", OPS)]),
            (self.depth_select, "value", view.depth),
            (self.depth_select, "disabled", not depths),
            (self.node_select, "options", [(box.label, i) for i, box in enumerate(view.boxes)]),
            (self.node_select, "value", None),
        ]

    def _on_tab(self, change: dict[str, Any]) -> None:
        if change["new"] is not None:
            self._apply(self._lazy_changes(TABS[change["new"]]))

    def _on_depth(self, change: dict[str, Any]) -> None:
        if self.view is not None and change["new"] != self.view.depth:
            self.show_depth(change["new"])

    def show_depth(self, depth: int) -> None:
        """Redraw the graph with one box per module at `depth` (`OPS`: every op)."""
        self._built.add(SectionId.GRAPH)
        self._apply(self._graph_changes(depth))
        self.node_details.value = ""

    def ensure_built(self) -> None:
        """Fill every lazy section now (the static copy shows them all)."""
        for section in TABS:
            self._apply(self._lazy_changes(section))

    def _apply(self, changes: list[tuple[Any, str, Any]]) -> None:
        """Set traits with one state message per widget (hold_sync batches each widget)."""
        with contextlib.ExitStack() as stack:
            for widget in {id(w): w for w, _, _ in changes}.values():
                stack.enter_context(widget.hold_sync())
            for widget, name, value in changes:
                setattr(widget, name, value)

    def _on_select(self, change: dict[str, Any]) -> None:
        self.show_node(change["new"])

    def show_node(self, index: int | None) -> None:
        """Show one graph box's saved tensors, birth and death lines; ring it in the graph."""
        view = self.view
        if view is None or index is None or not 0 <= index < len(view.boxes):
            self.node_details.value = ""
            return
        details = self.report.graph.details_of(view, index)
        label, *lines = (html.escape(line) for line in details.lines)
        facts = [f"<b>{label}</b>", *lines]
        table = details.buffers
        with self.graph_image.hold_sync(), self.node_details.hold_sync():
            self.node_details.value = div("<br>".join(facts)) + table_html(table)
            self._graph_png = figure_png(graph_figure(view, selected=index))
            self.graph_image.value = self._graph_png

    def close(self) -> None:
        """Stop live updates and close the widgets (their views disappear)."""
        self._closed = True
        for widget in self._widgets():
            widget.close()

    def _widgets(self) -> list[Any]:
        found, stack = [], [self.widget]
        while stack:
            widget = stack.pop()
            found.append(widget)
            stack.extend(getattr(widget, "children", ()))
        return found

    # ----- static fallback --------------------------------------------------------------
    def static_html(self) -> str:
        """The panel as one HTML document fragment, figures embedded as PNG."""
        self.ensure_built()
        return page(self.report, self._timeline_png, self._graph_png, self._graph_note)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """The widget view with static HTML and text fallbacks; with `companion` set (the magic
        displays `static_copy()` beside it) only a one-line text fallback, so frontends without
        widgets show one copy."""
        bundle = dict(self.widget._repr_mimebundle_() or {})
        if self.companion:
            bundle["text/plain"] = "autograd_magic panel (interactive; a static copy follows)"
            return bundle
        bundle["text/html"] = self.static_html()
        bundle["text/plain"] = self.text_report()
        return bundle

    def text_report(self) -> str:
        """The text report; of a finished trace made once, from the panel's own tables."""
        if not self.report.finished:
            return render_text(self.report)
        if self._text is None:
            self._text = render_text(self.report)
        return self._text

    def static_copy(self) -> StaticCopy:
        """The panel's static HTML (pictures embedded) and text report as their own output.

        nbconvert renders a widget view whenever the notebook stores widget state (the default
        of `--execute`), and that view needs a CDN: a separate output keeps findings, numbers and
        pictures in every saved notebook. Beside a rendered live panel it hides itself (CSS)."""
        self.companion = True
        return StaticCopy(static_copy_html(self.static_html()), self.text_report())


class StaticCopy:
    """An output holding only static HTML and text (see `TracePanel.static_copy`)."""

    def __init__(self, html_text: str, text: str) -> None:
        self.html, self.text = html_text, text

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/html": self.html, "text/plain": self.text}


def static_copy_html(fragment: str) -> str:
    """`fragment` in a block hidden where a live panel renders in the same output area
    (JupyterLab/Notebook 7: `.jp-OutputArea`; VS Code: `.cell_container`)."""
    hide = ", ".join(
        f"{area}:has(.{PANEL_CLASS}) .{STATIC_CLASS}"
        for area in (".jp-OutputArea", ".cell_container")
    )
    return f'<style>{hide}{{display:none}}</style><div class="{STATIC_CLASS}">{fragment}</div>'


_DRAWN = (SectionId.TIMELINE, SectionId.GRAPH)  # sections drawn as pictures, not tables
_EMPTY_TIMELINE: list[bytes] = []  # the "nothing recorded yet" picture, drawn once per process


def _timeline_png(timeline: Timeline, live: bool = False) -> tuple[bytes, str]:
    """The timeline as PNG and a note to show above it. Live: a sparkline (milliseconds, so it
    keeps up at every refresh) and the report's note giving its scales; finished: the full
    figure. A panel opened on an empty trace reuses one placeholder picture."""
    if not timeline.samples:
        if not _EMPTY_TIMELINE:
            _EMPTY_TIMELINE.append(figure_png(timeline_figure(timeline)))
        return _EMPTY_TIMELINE[0], ""
    if not live:
        return figure_png(timeline_figure(timeline)), ""
    png = sparkline_png(timeline.samples, timeline.backward_calls)
    return png, div(html.escape(timeline.live_note), MUTED_STYLE)


def side_by_side_bundle(named: Sequence[tuple[str, Trace]], block: str = "cell") -> dict[str, Any]:
    """Display bundle of several finished traces: comparison tables above their panels in a row,
    with the static side-by-side report and the comparison text as fallbacks."""
    from autograd_magic.views.report_html import comparison_html, comparison_text, side_by_side_html

    panels = [(name, TracePanel(trace, block=block)) for name, trace in named]
    columns = [
        widgets.VBox(
            [widgets.HTML(f"<h3>{html.escape(name)}</h3>"), panel.widget],
            layout={"flex": "1 1 0", "min_width": "0"},
        )
        for name, panel in panels
    ]
    reports = [(name, panel.report) for name, panel in panels]
    whole = widgets.VBox([widgets.HTML(comparison_html(reports)), widgets.HBox(columns)])
    bundle = dict(whole._repr_mimebundle_() or {})
    bundle["text/html"] = side_by_side_html(reports)
    bundle["text/plain"] = comparison_text(reports)
    return bundle


class Recording(Protocol):
    """What a live panel needs of the recorder filling its trace (`track()`'s object)."""

    trace: Trace

    def listen(self, callback: Callable[[Trace], None] | None, interval_s: float = ...) -> None:
        """Have `callback(trace)` called while the block runs."""


def live_panel(
    recorder: Recording,
    refresh_s: float = 1.0,
    max_nodes: int = DEFAULT_MAX_NODES,
    block: str = "cell",
) -> TracePanel:
    """A panel for the trace `recorder` fills, updated while it records (every `refresh_s`)."""
    panel = TracePanel(recorder.trace, max_nodes=max_nodes, block=block)
    recorder.listen(panel.live_update, refresh_s)
    return panel
