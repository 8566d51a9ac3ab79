"""The widget panel: what each section's widget says, node selection, live budget, fallback."""

from __future__ import annotations

import gc
import weakref

import torch
from traces import handmade_trace, report

import autograd_magic
from autograd_magic.report.model import SectionId
from autograd_magic.views.panel import TABS, TracePanel, live_panel
from autograd_magic.views.text import render_text


def test_summary_and_findings_read_like_the_report():
    panel = TracePanel(handmade_trace(error=True))
    assert "Stopped by RuntimeError at line 7" in panel.status.value
    assert "boom" not in panel.status.value  # the findings give PyTorch's text, once
    assert "3 now / 4 peak" in panel.summary.value
    assert "4.0 KiB now / 4.0 KiB peak" in panel.summary.value
    findings = panel.findings.value
    assert "Line 7 raised RuntimeError: boom." in findings
    assert "`loss` keeps the graph built at line 4 alive." in findings
    assert findings.index("Line 7 raised") < findings.index("`loss` keeps")
    assert "--jp-error-color1" in findings  # the error line is highlighted
    assert "Line 5: backward(retain_graph=True) released 1 saved tensor" in panel.calls.value


def test_tables_and_graph_are_built_when_their_tab_is_first_selected():
    # GIVEN a finished trace's panel: the cell's end drew the summary and timeline only
    panel = TracePanel(handmade_trace())
    assert panel.buffers.value == "" and panel.graph_image.value == b""
    # WHEN a table tab is selected THEN its tables are filled, and the others' are not yet
    panel.tabs.selected_index = TABS.index(SectionId.BUFFERS)
    assert "SumBackward0#4" in panel.buffers.value
    assert "released (line 5)" in panel.buffers.value
    assert "Totals by state" in panel.buffers.value
    assert panel.storage.value == ""
    # AND each other table tab is filled when it is selected
    panel.tabs.selected_index = TABS.index(SectionId.STORAGE)
    assert "copy of h_view" in panel.storage.value
    assert "detach" in panel.storage.value
    panel.tabs.selected_index = TABS.index(SectionId.VERSIONS)
    assert "BYPASS through h" in panel.versions.value
    assert "--jp-warn-color1" in panel.versions.value  # bypassing write flagged
    assert panel.tabs.titles == (
        "Timeline (1)",
        "Modules (0)",
        "Graph (4)",
        "Buffers (3)",
        "Storage (1)",
        "Versions (2)",
    )
    assert panel.graph_image.value == b""
    # AND the graph is drawn when its tab is selected
    panel.tabs.selected_index = TABS.index(SectionId.GRAPH)
    assert "All 4 recorded nodes are shown." in panel.graph_note.value
    assert bytes(panel.graph_image.value).startswith(b"\x89PNG")
    assert bytes(panel.timeline_image.value).startswith(b"\x89PNG")


def test_choosing_a_node_shows_its_saved_tensors_and_lines():
    panel = TracePanel(handmade_trace())
    panel.tabs.selected_index = TABS.index(SectionId.GRAPH)
    labels = [label for label, _ in panel.node_select.options]
    assert labels[0] == "AccumulateGrad (line 2)"
    before = panel.graph_image.value
    panel.node_select.value = labels.index("ExpBackward0 (line 3)")
    details = panel.node_details.value
    assert "created at line 3" in details
    assert "0 of 1 still alive; freed at line 6" in details
    assert "ExpBackward0#3" in details and "2x3" in details
    assert panel.graph_image.value != before  # ringed
    panel.node_select.value = None
    assert panel.node_details.value == ""


def test_static_fallback_has_images_text_and_the_widget_view():
    trace = handmade_trace()
    panel = TracePanel(trace)
    bundle = panel._repr_mimebundle_()
    assert bundle["text/plain"] == render_text(report(trace, "cell"))
    assert bundle["text/html"].count("data:image/png;base64,") == 2
    assert "3 now / 4 peak" in bundle["text/html"]
    assert "--jp-ui-font-color1" in bundle["text/html"]
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == panel.widget.model_id


def test_running_trace_shows_progress_and_fills_the_rest_at_finish():
    trace = autograd_magic.Trace()
    panel = TracePanel(trace)
    assert "running" in panel.status.value
    assert panel.buffers.value == ""
    finished = handmade_trace()
    panel.trace = finished
    panel.finish()
    assert "finished" in panel.status.value
    panel.tabs.selected_index = TABS.index(SectionId.BUFFERS)
    assert "SumBackward0#4" in panel.buffers.value


def test_live_updates_respect_the_time_budget():
    trace = handmade_trace()
    trace.finished = False
    panel = TracePanel(trace, live_budget=0.0)
    panel.live_update(trace)  # nothing spent yet: renders, timeline included
    assert panel.live_renders == 1
    timeline = panel.timeline_image.value
    trace.live_nodes = 99
    panel.live_update(trace)  # over the (zero) budget: skipped entirely
    assert panel.live_renders == 1
    assert "99 now" not in panel.summary.value
    assert panel.timeline_image.value == timeline


def test_live_panel_listens_while_recording_and_close_stops_it():
    x = torch.ones(4, requires_grad=True)
    recorder = autograd_magic.track(namespace={})
    with recorder:
        panel = live_panel(recorder, refresh_s=0.0)
        panel.live_budget = float("inf")  # every event renders; the budget has its own test
        y = x
        for _ in range(5):
            y = y * 2
        assert panel.live_renders >= 5
        assert "5 now / 5 peak" in panel.summary.value or "6 now" in panel.summary.value
        panel.close()
        renders = panel.live_renders
        y = y * 2
    assert panel.live_renders == renders
    assert panel.widget.comm is None


def test_live_storage_groups_hide_dead_temporaries_as_the_finished_panel_does():
    """GIVEN a loop detaching a temporary per step (both die at once) WHEN the live view reads
    the trace THEN it counts the storage groups the finished trace counts (it showed every dead
    pair: 71 groups live for 0 at the end)."""
    seen = []
    recorder = autograd_magic.track(namespace={})
    with recorder as trace:
        recorder.listen(lambda t: seen.append(len(t.storage_groups())), interval_s=0.0)
        for _ in range(20):
            torch.randn(3).exp().detach()
    assert seen and max(seen) <= 1
    assert len(trace.storage_groups()) == 0


def test_panel_keeps_no_user_tensor_alive():
    namespace: dict = {}
    with autograd_magic.track(namespace=namespace) as trace:
        a = torch.rand(64, requires_grad=True)
        b = (a * 2).exp()
        loss = b.sum()
    panel = TracePanel(trace)
    panel.ensure_built()
    panel.node_select.value = 0
    refs = [weakref.ref(t) for t in (a, b, loss)]
    del a, b, loss
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    assert "ExpBackward0" in panel.buffers.value


def test_saved_output_lists_twenty_rows_and_says_how_many_the_panel_has():
    # GIVEN a trace with 30 saved tensors (30 separate exp graphs kept alive)
    x = torch.ones(30, requires_grad=True)
    with autograd_magic.track() as trace:
        kept = [x[: n + 1].exp() for n in range(30)]  # sizes differ: 30 rows, not one group
    panel = TracePanel(trace)
    # WHEN the panel is saved as static HTML
    saved = panel._repr_mimebundle_()["text/html"]  # builds every tab
    # THEN the widget's table has all 30 rows, the saved output 20 and a note saying so
    assert panel.buffers.value.count("ExpBackward0#") == 30
    assert saved.count("ExpBackward0#") == 20
    assert "Showing 20 of 30 rows in this saved output" in saved
    del kept
