"""Exports of a `Trace`: a networkx graph of the autograd graph, and a versioned JSON document.

JSON loading builds records from plain values only: nothing is executed or unpickled.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from autograd_magic.model.records import (
    AliasLink,
    BackwardCall,
    Blindspot,
    Finding,
    Holder,
    NodeRecord,
    SavedBuffer,
    Site,
    TimelineSample,
    VersionBump,
)

if TYPE_CHECKING:
    import networkx

    from autograd_magic.model.trace import Trace

FORMAT = "autograd_magic.trace"
FORMAT_VERSION = 2  # 2: records carry `module`; module_calls and module_types added
READABLE_VERSIONS = (1, 2)  # a version-1 export reads as a trace without module attribution


def to_networkx(trace: Trace) -> networkx.DiGraph:
    """Nodes keyed by id (name, alive, born/freed lines, saved bytes); edges node -> next."""
    import networkx  # loaded when a graph is first asked for, not with the package

    saved: dict[int, int] = {}
    for buffer in trace.buffers:
        if buffer.node_id is not None:
            saved[buffer.node_id] = saved.get(buffer.node_id, 0) + buffer.nbytes
    graph = networkx.DiGraph()
    for node in trace.nodes:
        graph.add_node(
            node.id,
            name=node.name,
            alive=node.alive,
            born_line=node.born_line,
            freed_line=node.freed_line,
            saved_bytes=saved.get(node.id, 0),
            existed_before=node.existed_before,
        )
    for node in trace.nodes:
        for child in node.next_ids:
            if child in graph:
                graph.add_edge(node.id, child)
    return graph


_SCALARS = (
    "max_records",
    "max_timeline",
    "dropped_nodes",
    "dropped_buffers",
    "dropped_events",
    "finished",
    "error",
    "seq",
    "live_nodes",
    "retained_bytes",
    "peak_live_nodes",
    "peak_retained_bytes",
    "nodes_created",
    "buffers_saved",
)
_LISTS: dict[str, type] = {
    "nodes": NodeRecord,
    "buffers": SavedBuffer,
    "links": AliasLink,
    "version_bumps": VersionBump,
    "backward_calls": BackwardCall,
    "findings": Finding,
    "blindspots": Blindspot,
    "holders": Holder,
}
_SITE_FIELDS = {"born_site", "freed_site", "saved_site", "site", "error_site"}


def _plain(record: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        out[f.name] = dataclasses.asdict(value) if isinstance(value, Site) else value
    return out


def trace_to_json(trace: Trace) -> str:
    """Serialize every record and counter of `trace`."""
    document: dict[str, Any] = {"format": FORMAT, "version": FORMAT_VERSION}
    document.update({name: getattr(trace, name) for name in _SCALARS})
    document["error_site"] = None if trace.error_site is None else _plain(trace.error_site)
    for name in _LISTS:
        document[name] = [_plain(r) for r in getattr(trace, name)]
    document["timeline"] = [list(s) for s in trace.timeline]
    document["labels"] = {str(k): v for k, v in trace.labels.items()}
    document["object_kinds"] = {str(k): v for k, v in trace.object_kinds.items()}
    document["module_calls"] = dict(trace.module_calls)
    document["module_types"] = dict(trace.module_types)
    alive = trace.alive_at_end
    document["alive_at_end"] = None if alive is None else sorted(alive)
    return json.dumps(document)


def _build(cls: type, values: dict[str, Any]) -> Any:
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        value = values[f.name]
        if f.name in _SITE_FIELDS and value is not None:
            value = Site(**value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def trace_fields(text: str) -> dict[str, Any]:
    """The `Trace` fields of a `trace_to_json` document, for `Trace.from_records`; raises
    ValueError on other documents. Builds records from plain values only."""
    document = json.loads(text)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError("not an autograd_magic trace export")
    if document.get("version") not in READABLE_VERSIONS or type(document["version"]) is not int:
        raise ValueError(
            f"trace export version {document.get('version')} is not supported "
            f"(this autograd_magic reads version {FORMAT_VERSION})"
        )
    fields: dict[str, Any] = {name: document[name] for name in _SCALARS if name in document}
    if document.get("error_site"):
        fields["error_site"] = Site(**document["error_site"])
    for name, cls in _LISTS.items():
        fields[name] = [_build(cls, values) for values in document[name]]
    fields["timeline"] = [TimelineSample(*values) for values in document["timeline"]]
    fields["labels"] = {int(k): v for k, v in document["labels"].items()}
    fields["object_kinds"] = {int(k): v for k, v in document["object_kinds"].items()}
    fields["module_calls"] = dict(document.get("module_calls", {}))
    fields["module_types"] = dict(document.get("module_types", {}))
    alive = document.get("alive_at_end")
    fields["alive_at_end"] = None if alive is None else set(alive)
    return fields
