"""Exports: the networkx view of the recorded graph and the versioned JSON document."""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
import pickle
import re

import numpy as np
import pytest
import torch
from markers import marker_lines

import autograd_magic as am
from autograd_magic.model.export import FORMAT_VERSION

line_of = marker_lines(__file__)


def _recorded() -> am.Trace:
    """A trace with every kind of record: nodes, buffers, links, bumps, calls, an error."""
    x = torch.randn(4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    with pytest.raises(ZeroDivisionError), am.track() as trace:
        arr = np.ones(4, dtype=np.float32)
        t = torch.from_numpy(arr)
        y = x.exp()  # L:exp
        z = (y * w).sum()  # L:sum
        z.backward(retain_graph=True)
        d = t.detach()
        d.add_(1)
        copy = t.clone()
        with torch.autograd.graph.save_on_cpu():
            (w * w).sum().backward()
        1 / 0  # noqa: B018 (the block raises mid-way)
    del arr, copy, y, z
    return trace


def _state(trace: am.Trace) -> dict:
    """Everything a reader of a trace can see, as comparable values."""
    return {
        "nodes": trace.nodes,
        "buffers": trace.buffers,
        "links": trace.links,
        "version_bumps": trace.version_bumps,
        "backward_calls": trace.backward_calls,
        "findings": trace.findings,
        "blindspots": trace.blindspots,
        "holders": trace.holders,
        "timeline": trace.timeline,
        "labels": trace.labels,
        "object_kinds": trace.object_kinds,
        "snapshot": trace.snapshot(),
        "groups": trace.storage_groups(),
        "error": (trace.error, trace.error_site, trace.finished),
        "caps": (trace.max_records, trace.max_timeline, trace.dropped_nodes, trace.seq),
    }


# ----- networkx -------------------------------------------------------------------------------


def test_graph_has_one_node_per_record_and_edges_as_next_functions():
    """GIVEN exp then mul by a leaf then sum WHEN exported THEN nodes carry name, liveness,
    lines and saved bytes, and edges follow next_functions."""
    x = torch.randn(4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    with am.track() as trace:
        y = x.exp()  # L:g-exp
        z = (y * w).sum()  # L:g-sum
        del y  # from here only the graph holds exp's result
    graph = trace.graph()
    by_name = {}
    for node_id, data in graph.nodes(data=True):
        by_name.setdefault(data["name"], []).append(node_id)
    (exp,), (mul,), (total,) = (
        by_name["ExpBackward0"],
        by_name["MulBackward0"],
        by_name["SumBackward0"],
    )
    assert len(by_name["AccumulateGrad"]) == 2
    assert graph.nodes[exp]["born_line"] == line_of("g-exp")
    assert graph.nodes[total]["born_line"] == line_of("g-sum")
    # exp saved its result; mul saved y (the graph's) and w (the code's, which outlives it).
    assert graph.nodes[exp]["saved_bytes"] == 16 and graph.nodes[mul]["saved_bytes"] == 16
    assert graph.nodes[mul]["held_elsewhere_bytes"] == 16
    assert graph.nodes[exp]["held_elsewhere_bytes"] == 0
    assert graph.nodes[total]["alive"] and graph.nodes[total]["freed_line"] is None
    assert set(graph.successors(total)) == {mul}
    (acc_x,) = graph.successors(exp)
    (acc_w,) = set(by_name["AccumulateGrad"]) - {acc_x}
    assert set(graph.successors(mul)) == {exp, acc_w}
    assert graph.nodes[acc_x]["name"] == "AccumulateGrad"
    assert graph.number_of_edges() == 4
    del z  # after the block: the finished trace keeps the block's end state
    assert trace.graph().nodes[total]["alive"] is True


# ----- JSON -----------------------------------------------------------------------------------


def test_json_round_trip_restores_every_record():
    """GIVEN a trace with every kind of record WHEN exported and loaded THEN the loaded trace
    reads exactly the same."""
    trace = _recorded()
    text = trace.to_json()
    loaded = am.Trace.from_json(text)
    assert _state(loaded) == _state(trace)
    assert loaded.to_json() == text
    assert json.loads(text)["version"] == FORMAT_VERSION
    assert trace.error == "ZeroDivisionError: division by zero"
    assert {b.kind for b in loaded.blindspots} >= {"saved-tensor-hooks"}


def test_loaded_graph_equals_the_recorded_graph():
    trace = _recorded()
    original, loaded = trace.graph(), am.Trace.from_json(trace.to_json()).graph()
    assert dict(loaded.nodes(data=True)) == dict(original.nodes(data=True))
    assert set(loaded.edges) == set(original.edges)


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '"autograd_magic.trace"',
        json.dumps({"format": "something else", "version": FORMAT_VERSION}),
        json.dumps({"version": FORMAT_VERSION}),
    ],
)
def test_from_json_rejects_documents_that_are_not_exports(text):
    with pytest.raises(ValueError, match="not an autograd_magic trace export"):
        am.Trace.from_json(text)


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 0, "1", None])
def test_from_json_rejects_unknown_versions(version):
    document = json.loads(am.Trace().to_json())
    document["version"] = version
    with pytest.raises(ValueError, match="not supported"):
        am.Trace.from_json(json.dumps(document))


def test_loading_executes_nothing(tmp_path, monkeypatch):
    """GIVEN an export whose strings are code and whose records carry extra keys
    WHEN loaded THEN the strings stay strings and nothing runs."""
    marker = tmp_path / "ran"
    payload = f"__import__('os').system('touch {marker}')"
    document = json.loads(_recorded().to_json())
    document["labels"] = {"1": payload}
    document["error"] = payload
    document["nodes"][0]["name"] = payload
    document["nodes"][0]["__reduce__"] = payload  # not a field: ignored, never called
    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, _forbidden)
    monkeypatch.setattr(pickle, "loads", _forbidden)
    loaded = am.Trace.from_json(json.dumps(document))
    monkeypatch.undo()
    assert loaded.labels[1] == payload and loaded.error == payload
    assert loaded.nodes[0].name == payload
    assert not os.path.exists(marker)
    assert all(type(n) is am.NodeRecord for n in loaded.nodes)


def _forbidden(*args, **kwargs):
    raise AssertionError("loading a trace must not evaluate code")


def _mutated(change) -> str:
    document = json.loads(_recorded().to_json())
    change(document)
    return json.dumps(document)


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("live_nodes", lambda d: d.update(live_nodes="lots")),
        ("live_nodes", lambda d: d.update(live_nodes=-1)),
        ("retained_bytes", lambda d: d.update(retained_bytes=True)),
        ("max_records", lambda d: d.pop("max_records")),
        ("nodes[0].name", lambda d: d["nodes"][0].update(name=3)),
        ("nodes[0].id", lambda d: d["nodes"][0].pop("id")),
        ("nodes[0].born_site.line", lambda d: d["nodes"][0]["born_site"].update(line="7")),
        ("nodes[0].next_ids[0]", lambda d: d["nodes"][0].update(next_ids=[None])),
        ("buffers[0].shape", lambda d: d["buffers"][0].update(shape=5)),
        ("nodes", lambda d: d.update(nodes={"0": {}})),
        ("timeline[0]", lambda d: d["timeline"].__setitem__(0, [1, 2])),
        ("labels", lambda d: d.update(labels={"x": "a"})),
        ("error", lambda d: d.update(error=["x"])),
        ("alive_at_end[0]", lambda d: d.update(alive_at_end=["1"])),
    ],
)
def test_from_json_names_the_field_that_is_wrong(field, change):
    with pytest.raises(ValueError, match=re.escape(field)):
        am.Trace.from_json(_mutated(change))


def test_from_json_rejects_a_boolean_version():
    with pytest.raises(ValueError, match="not supported"):
        am.Trace.from_json(_mutated(lambda d: d.update(version=True)))


def test_from_json_enforces_the_record_caps():
    def flood(document):
        document["max_records"] = 10
        document["nodes"] = [document["nodes"][0]] * 11

    with pytest.raises(ValueError, match="nodes: 11 entries, more than the cap of 10"):
        am.Trace.from_json(_mutated(flood))
    with pytest.raises(ValueError, match="max_records"):
        am.Trace.from_json(_mutated(lambda d: d.update(max_records=10**12)))


def test_findings_of_a_loaded_trace_do_not_depend_on_the_order_of_its_records():
    """GIVEN a trace whose findings read buffers by node (graphs kept unused in a list, with a
    retained graph) WHEN exported, its node and buffer lists reversed, and loaded THEN the
    analysis words the same findings (records are looked up by id whatever their order)."""
    from autograd_magic.analysis.findings import find_facts
    from autograd_magic.report.wording import finding

    def analyze(trace: am.Trace) -> list:
        return [finding(f) for f in find_facts(trace)]

    model = torch.nn.Linear(8, 8)
    kept = []
    with am.track() as trace:
        for _ in range(3):
            out = model(torch.randn(4, 8)).relu().sum()
            kept.append(out)
        loss = model(torch.randn(4, 8)).tanh().sum()
        loss.backward(retain_graph=True)
    document = json.loads(trace.to_json())
    document["nodes"].reverse()
    document["buffers"].reverse()
    shuffled = am.Trace.from_json(json.dumps(document))
    assert [f.message for f in analyze(shuffled)] == [f.message for f in analyze(trace)]
    assert {f.kind for f in analyze(trace)} >= {"kept-alive", "retained-graph"}
    del kept, loss


# ----- files of older formats ---------------------------------------------------------------


def _leaky() -> am.Trace:
    """A finished trace with a finding: three graphs kept in a list."""
    w = torch.ones(4, requires_grad=True)
    with am.track() as trace:
        kept = [(w * i).exp().sum() for i in range(3)]  # L:kept
    del kept
    return trace


def _older(trace: am.Trace, version: int, findings: list[am.Finding]) -> str:
    """`trace` as a file of format `version` (1-3) stored it: worded findings, no facts."""
    document = json.loads(trace.to_json())
    del document["facts"], document["sources"]
    document["version"] = version
    document["findings"] = [dataclasses.asdict(f) for f in findings]
    if version < 3:  # buffers had no `held_by`: a leaf's bytes were not retained
        for buffer in document["buffers"]:
            del buffer["held_by"]
    if version < 2:  # no module attribution
        del document["module_calls"], document["module_types"]
        for record in document["nodes"] + document["buffers"]:
            record.pop("module", None)
    return json.dumps(document)


def test_the_json_stores_the_findings_as_facts():
    """GIVEN a trace with a finding WHEN exported THEN the file holds its facts (no words) and
    the lines they cite, and the loaded trace words the same findings."""
    trace = _leaky()
    document = json.loads(trace.to_json())
    assert document["version"] == FORMAT_VERSION == 4 and "findings" not in document
    assert len(document["facts"]) == len(trace.facts) >= 1
    assert __file__ in document["sources"]
    loaded = am.Trace.from_json(trace.to_json())
    assert loaded.findings == trace.findings
    assert loaded.stored_findings is None


def test_a_version_3_files_worded_findings_load_and_render_as_stored():
    """GIVEN a file of format 3, whose findings were stored as sentences WHEN loaded THEN its
    findings are those sentences (not found again, not reworded), and every report shows them."""
    from autograd_magic.views.html import static_html
    from autograd_magic.views.panel import TracePanel
    from autograd_magic.views.text import render_text

    trace = _leaky()
    line = line_of("kept")
    stored = am.Finding("kept-alive", "`kept` holds 3 graphs (as worded then).", line, (line,))
    loaded = am.Trace.from_json(_older(trace, 3, [stored]))
    assert loaded.stored_findings == [stored] and loaded.findings == [stored]
    # THEN the text report, the static HTML and the panel show the stored sentence
    report = loaded.report()
    assert report.findings == (stored,)
    assert f"  - Line {line}: `kept` holds 3 graphs (as worded then)." in render_text(report)
    assert "`kept` holds 3 graphs (as worded then)." in static_html(report)
    assert "`kept` holds 3 graphs (as worded then)." in TracePanel(loaded).findings.value
    # AND its records and numbers read as the live trace's
    assert loaded.nodes == trace.nodes and loaded.snapshot() == trace.snapshot()
    assert loaded.modules() == trace.modules()


def test_a_version_3_file_saved_again_keeps_its_worded_findings():
    """GIVEN a file of format 3 loaded WHEN saved again (format 4) and loaded THEN its findings
    are still the sentences it stored, not findings found again in other words."""
    stored = am.Finding("kept-alive", "`kept` holds 3 graphs (as worded then).", 3, ())
    loaded = am.Trace.from_json(_older(_leaky(), 3, [stored]))
    again = am.Trace.from_json(loaded.to_json())
    assert again.findings == [stored]


def test_a_version_3_file_without_findings_says_no_findings():
    loaded = am.Trace.from_json(_older(_leaky(), 3, []))
    assert loaded.findings == []
    assert loaded.report().sentences[0].text == "No findings."


@pytest.mark.parametrize("version", [1, 2])
def test_files_of_versions_1_and_2_load_with_the_leaf_rule_of_their_time(version):
    """GIVEN a file of format 1 or 2 (buffers without `held_by`; format 1 also without modules)
    WHEN loaded THEN a leaf's saved tensor is held by the user (not retained), as counted then,
    and a format-1 trace has no module attribution."""
    model = torch.nn.Linear(4, 4)
    with am.track() as trace:
        loss = model(torch.ones(2, 4)).exp().sum()
    stored = am.Finding("kept-alive", "`loss` keeps its graph.", 3)
    loaded = am.Trace.from_json(_older(trace, version, [stored]))
    assert loaded.findings == [stored]
    assert len(loaded.buffers) == len(trace.buffers)
    held = {b.held_by for b in loaded.buffers if b.is_leaf}
    assert held and held <= {"parameter", "user tensor"}
    assert all(not b.is_leaf or b.held_by for b in loaded.buffers)
    assert bool(loaded.module_calls) == (version == 2)
    assert bool(loaded.modules()) == (version == 2)
    del loss
