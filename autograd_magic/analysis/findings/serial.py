"""Facts as JSON: plain dicts, lists, strings, numbers, booleans and None, so a saved trace can
keep its findings as data and word them again when it is loaded.

A fact's dict carries its `kind` and `form`, which pick its class; its other keys are the
class's fields. A `Site`, `SavedBy` or `Growth` is a dict of its fields, tuples are lists. A
`cause` is the cause's own dict in `fact_to_dict`; `facts_to_json_list` writes it as the index
of the cause in the list instead, so that a loaded list shares one cause object as the found
one did. Loading checks every value against its field's type and raises ValueError naming the
first one that does not fit.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable
from typing import Any

from autograd_magic.analysis.findings.facts import FACT_TYPES, Fact, GraphGrowth
from autograd_magic.model.validate import check_value

_HINTS: dict[type, dict[str, Any]] = {}


def fact_to_dict(fact: Fact) -> dict[str, Any]:
    """`fact` as plain JSON data; its cause, when it has one, nested as a dict."""
    return _encode(fact, {})


def fact_from_dict(data: Any) -> Fact:
    """The fact `fact_to_dict` wrote; ValueError for an unknown form or a mistyped field."""
    return _decode(data, [], "fact")


def facts_to_json_list(facts: Iterable[Fact]) -> list[dict[str, Any]]:
    """`facts` as plain JSON data; a cause that is in the list is written as its index."""
    facts = list(facts)
    index = {id(f): i for i, f in enumerate(facts)}
    return [_encode(f, index) for f in facts]


def facts_from_json_list(items: Any) -> list[Fact]:
    """The facts `facts_to_json_list` wrote, a cause given by index being the very fact loaded
    at that index (which must come earlier in the list)."""
    if type(items) is not list:
        raise ValueError(f"facts: expected a list, got {type(items).__name__}")
    facts: list[Fact] = []
    for i, item in enumerate(items):
        facts.append(_decode(item, facts, f"facts[{i}]"))
    return facts


def _encode(fact: Fact, index: dict[int, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": fact.kind, "form": fact.form}
    for f in dataclasses.fields(fact):
        value = getattr(fact, f.name)
        if f.name == "cause" and value is not None:
            out[f.name] = index[id(value)] if id(value) in index else _encode(value, index)
        else:
            out[f.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _decode(data: Any, loaded: list[Fact], where: str) -> Fact:
    if type(data) is not dict:
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    tag = (data.get("kind"), data.get("form"))
    cls = next((c for c in FACT_TYPES if (c.kind, c.form) == tag), None)
    if cls is None:
        raise ValueError(f"{where}: unknown finding form {tag[0]!r}/{tag[1]!r}")
    hints = _hints(cls)

    def field_value(name: str, value: Any, at: str) -> Any:
        return _cause(value, loaded, at) if name == "cause" else _value(value, hints[name], at)

    return _record(cls, data, where, field_value)


def _record(cls: Any, data: dict[str, Any], where: str, convert: Any) -> Any:
    """A `cls` made of the fields in `data`, each converted by `convert(name, value, where)`;
    a missing field without a default is a ValueError, unknown keys are ignored."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING:
                raise ValueError(f"{where}.{f.name}: missing")
            continue
        kwargs[f.name] = convert(f.name, data[f.name], f"{where}.{f.name}")
    return cls(**kwargs)


def _cause(value: Any, loaded: list[Fact], where: str) -> GraphGrowth | None:
    if value is None:
        return None
    if type(value) is int:
        if not 0 <= value < len(loaded):
            raise ValueError(f"{where}: {value} is not the index of an earlier fact")
        cause = loaded[value]
    else:
        cause = _decode(value, loaded, where)
    if not isinstance(cause, GraphGrowth):
        raise ValueError(f"{where}: a cause is a graph-growth fact, not {cause.kind!r}")
    return cause


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _value(value: Any, hint: Any, where: str) -> Any:
    """`value` checked against `hint`, records and tuples of fixed length built here, the
    rest checked by the trace loader's own `check_value`."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        (inner,) = [o for o in typing.get_args(hint) if o is not type(None)]
        return _value(value, inner, where)
    if dataclasses.is_dataclass(hint):  # a Site, SavedBy or Growth
        if type(value) is not dict:
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        hints = _hints(hint)  # type: ignore[arg-type]
        return _record(hint, value, where, lambda name, v, at: _value(v, hints[name], at))
    args = typing.get_args(hint)
    if origin is tuple and Ellipsis not in args:
        if type(value) is not list or len(value) != len(args):
            raise ValueError(f"{where}: expected a list of {len(args)}")
        return tuple(
            _value(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True))
        )
    if origin is tuple:
        if type(value) is not list:
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(_value(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    return check_value(value, hint, where)
