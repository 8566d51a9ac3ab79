"""Exports of a `Trace`: a networkx graph of the autograd graph, and a versioned JSON document.

JSON loading builds records from plain values only: nothing is executed or unpickled.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
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
from autograd_magic.model.validate import (
    MAX_CAP,
    build_record,
    check_id_map,
    check_int,
    check_list,
    check_value,
)

if TYPE_CHECKING:
    import networkx

FORMAT = "autograd_magic.trace"
# 2: records carry `module`; module_calls and module_types added. 3: buffers carry `held_by`.
# 4: findings are stored as the analysis's facts (no words), with the source lines they cite.
FORMAT_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)  # a version-1 export reads as a trace without module attribution


def to_networkx(nodes: Iterable[NodeRecord], buffers: Iterable[SavedBuffer]) -> networkx.DiGraph:
    """Nodes keyed by id (name, alive, born/freed lines, saved bytes); edges node -> next.

    `saved_bytes` means what it means everywhere (the Modules table, the graph view): bytes the
    graphs alone hold; what a node saved that something else holds too (parameters, module
    buffers, the user's tensors) is `held_elsewhere_bytes`."""
    import networkx  # loaded when a graph is first asked for, not with the package

    nodes = list(nodes)
    saved: dict[int, int] = {}
    elsewhere: dict[int, int] = {}
    for buffer in buffers:
        if buffer.node_id is not None:
            into = saved if buffer.retained else elsewhere
            into[buffer.node_id] = into.get(buffer.node_id, 0) + buffer.nbytes
    graph = networkx.DiGraph()
    for node in nodes:
        graph.add_node(
            node.id,
            name=node.name,
            alive=node.alive,
            born_line=node.born_line,
            freed_line=node.freed_line,
            saved_bytes=saved.get(node.id, 0),
            held_elsewhere_bytes=elsewhere.get(node.id, 0),
            existed_before=node.existed_before,
        )
    for node in nodes:
        for child in node.next_ids:
            if child in graph:
                graph.add_edge(node.id, child)
    return graph


# Scalar counters and their checks: (field, smallest value); `error` and `finished` apart.
_COUNTERS = (
    "dropped_nodes",
    "dropped_buffers",
    "dropped_events",
    "seq",
    "live_nodes",
    "retained_bytes",
    "peak_live_nodes",
    "peak_retained_bytes",
    "nodes_created",
    "buffers_saved",
)
# Every scalar field, in the order the export writes them.
_SCALARS = ("max_records", "max_timeline", *_COUNTERS[:3], "finished", "error", *_COUNTERS[3:])
_LISTS: dict[str, type] = {
    "nodes": NodeRecord,
    "buffers": SavedBuffer,
    "links": AliasLink,
    "version_bumps": VersionBump,
    "backward_calls": BackwardCall,
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


def trace_to_json(
    fields: Mapping[str, Any],
    facts: Sequence[Mapping[str, Any]] = (),
    sources: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """Serialize every record and counter of a trace, given its fields by name (`vars(trace)`),
    with the analysis's `facts` as plain JSON data and the `sources` (file -> lines) they cite,
    so that a loaded trace words them as the live one did."""
    document: dict[str, Any] = {"format": FORMAT, "version": FORMAT_VERSION}
    document.update({name: fields[name] for name in _SCALARS})
    site = fields["error_site"]
    document["error_site"] = None if site is None else _plain(site)
    document["home_file"] = fields.get("home_file")
    for name in _LISTS:
        document[name] = [_plain(r) for r in fields[name]]
    document["timeline"] = [list(s) for s in fields["timeline"]]
    document["labels"] = {str(k): v for k, v in fields["labels"].items()}
    document["object_kinds"] = {str(k): v for k, v in fields["object_kinds"].items()}
    document["module_calls"] = dict(fields["module_calls"])
    document["module_types"] = dict(fields["module_types"])
    alive = fields["alive_at_end"]
    document["alive_at_end"] = None if alive is None else sorted(alive)
    document["facts"] = [dict(f) for f in facts]
    stored = fields.get("stored_findings")
    if stored is not None:  # read from a file of format 1-3: kept as worded then
        document["stored_findings"] = [_plain(f) for f in stored]
    document["sources"] = {file: list(lines) for file, lines in (sources or {}).items()}
    return json.dumps(document)


def trace_fields(text: str) -> dict[str, Any]:
    """The `Trace` fields of a `trace_to_json` document, for `Trace.from_records`; raises
    ValueError naming the first field that is missing, mistyped, out of range or over its cap
    (and on other documents). Builds records from plain values only."""
    try:
        document = json.loads(text)
    except (TypeError, RecursionError) as error:
        raise ValueError(f"not an autograd_magic trace export: {error}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError("not an autograd_magic trace export")
    version = document.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise ValueError(
            f"trace export version {version!r} is not supported "
            f"(this autograd_magic reads version {FORMAT_VERSION})"
        )
    missing = [key for key in _required_keys(version) if key not in document]
    if missing:
        raise ValueError(f"{missing[0]}: missing (a version-{version} export has every field)")
    max_records = check_int(document.get("max_records"), "max_records", 1, MAX_CAP)
    max_timeline = check_int(document.get("max_timeline"), "max_timeline", 1, MAX_CAP)
    fields: dict[str, Any] = {"max_records": max_records, "max_timeline": max_timeline}
    for name in _COUNTERS:
        fields[name] = check_int(document.get(name, 0), name)
    fields["finished"] = check_value(document.get("finished", False), bool, "finished")
    fields["error"] = check_value(document.get("error"), str | None, "error")
    site = document.get("error_site")
    fields["error_site"] = None if site is None else build_record(Site, site, "error_site")
    # Optional: files saved before it was recorded have none.
    fields["home_file"] = check_value(document.get("home_file"), str | None, "home_file")
    for name, cls in _LISTS.items():
        fields[name] = _records(document, name, cls, max_records)
    if version < 4:  # worded when saved; shown as they were
        fields["stored_findings"] = _records(document, "findings", Finding, max_records)
    else:  # decoded (and checked) by the analysis, which owns the facts' forms
        facts = check_list(document, "facts", max_records)
        for i, fact in enumerate(facts):
            if type(fact) is not dict:
                raise ValueError(f"facts[{i}]: expected an object, got {type(fact).__name__}")
        fields["stored_facts"] = facts
        if "stored_findings" in document:
            fields["stored_findings"] = _records(document, "stored_findings", Finding, max_records)
        sources = check_value(document.get("sources"), dict[str, tuple[str, ...]], "sources")
        fields["sources"] = {file: list(lines) for file, lines in sources.items()}
    if version < 3:  # counted by PyTorch's leaf flag then: a leaf's bytes were not retained
        for buffer in fields["buffers"]:
            if buffer.is_leaf:
                buffer.held_by = "parameter" if buffer.is_parameter else "user tensor"
    timeline = check_list(document, "timeline", max_timeline)
    fields["timeline"] = [_sample(v, f"timeline[{i}]") for i, v in enumerate(timeline)]
    fields["labels"] = check_id_map(document, "labels", max_records)
    fields["object_kinds"] = check_id_map(document, "object_kinds", max_records)
    for name, shape in (("module_calls", dict[str, int]), ("module_types", dict[str, str])):
        fields[name] = check_value(document.get(name, {}), shape, name)
        if len(fields[name]) > max_records:
            raise ValueError(f"{name}: more than the cap of {max_records}")
    alive = document.get("alive_at_end")
    if alive is not None:
        alive = set(check_value(alive, tuple[int, ...], "alive_at_end"))
        if len(alive) > max_records:
            raise ValueError(f"alive_at_end: more than the cap of {max_records}")
    fields["alive_at_end"] = alive
    return fields


def _records(document: dict, name: str, cls: type, cap: int) -> list[Any]:
    """The document's list `name` as `cls` records, each checked (errors name `name[i]`)."""
    values = check_list(document, name, cap)
    return [build_record(cls, v, f"{name}[{i}]") for i, v in enumerate(values)]


def _required_keys(version: int) -> tuple[str, ...]:
    """The top-level fields every export of `version` writes (`trace_to_json`'s keys)."""
    keys = (*_SCALARS, "error_site", *_LISTS, "timeline", "labels", "object_kinds", "alive_at_end")
    keys = (*keys, "module_calls", "module_types") if version >= 2 else keys
    return (*keys, "facts", "sources") if version >= 4 else (*keys, "findings")


def _sample(values: Any, where: str) -> TimelineSample:
    if type(values) is not list or len(values) != len(TimelineSample._fields):
        raise ValueError(f"{where}: expected a list of {len(TimelineSample._fields)} values")
    seq, live, retained, what, line = values
    return TimelineSample(
        check_int(seq, f"{where}.seq"),
        check_int(live, f"{where}.live_nodes"),
        check_int(retained, f"{where}.retained_bytes"),
        check_value(what, str, f"{where}.what"),
        check_int(line, f"{where}.line"),
    )
