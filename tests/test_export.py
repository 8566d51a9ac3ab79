"""Exports: the networkx view of the recorded graph and the versioned JSON document."""

from __future__ import annotations

import builtins
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
