"""Checks a JSON trace document field by field before anything is built from it.

Every value must have the type its record field declares (no bool for int), counts and ids
must be non-negative, and record lists must stay within the document's own caps. A failure
raises ValueError naming the field (`nodes[3].born_site.line`); nothing is ever executed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from autograd_magic.model.records import Site

# Larger caps than any trace records: a document claiming more is not an export.
MAX_CAP = 10_000_000


def check_int(value: Any, where: str, low: int = 0, high: int | None = None) -> int:
    """`value` as a non-bool int in [low, high]."""
    if type(value) is not int:
        raise ValueError(f"{where}: expected an integer, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{where}: {value} is out of range")
    return value


def check_value(value: Any, hint: Any, where: str) -> Any:
    """`value` checked against a field's type hint; lists become tuples for tuple fields."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return check_value(value, inner, where)
    if origin is typing.Literal:
        if value not in typing.get_args(hint) or type(value) is not str:
            raise ValueError(f"{where}: {str(value)[:40]!r} is not one of {typing.get_args(hint)}")
        return value
    if hint is int:
        return check_int(value, where, low=-(2**63))
    if hint in (str, bool, float):
        if type(value) is not hint and not (hint is float and type(value) is int):
            raise ValueError(f"{where}: expected {hint.__name__}, got {type(value).__name__}")
        return value
    if hint is Site:
        return build_record(Site, value, where)
    if origin is tuple:
        if type(value) is not list:
            raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return tuple(check_value(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if type(value) is not dict:
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        _, item = typing.get_args(hint)
        return {k: check_value(v, item, f"{where}[{k!r}]") for k, v in value.items()}
    raise ValueError(f"{where}: cannot check a field of type {hint!r}")


_HINTS: dict[type, dict[str, Any]] = {}
_NON_NEGATIVE = frozenset(
    {"id", "seq", "nbytes", "storage_nbytes", "version", "saved_seq", "storage_key", "line"}
)


def build_record(cls: type, values: Any, where: str) -> Any:
    """A `cls` record from a JSON object, every field checked; unknown keys are ignored."""
    if type(values) is not dict:
        raise ValueError(f"{where}: expected an object, got {type(values).__name__}")
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where}.{f.name}: missing")
            continue
        value = check_value(values[f.name], hints[f.name], f"{where}.{f.name}")
        if f.name in _NON_NEGATIVE and type(value) is int and value < 0:
            raise ValueError(f"{where}.{f.name}: {value} is out of range")
        kwargs[f.name] = value
    return cls(**kwargs)


def check_list(document: dict, name: str, cap: int) -> list:
    """The document's list `name`, at most `cap` long."""
    value = document.get(name, [])
    if type(value) is not list:
        raise ValueError(f"{name}: expected a list, got {type(value).__name__}")
    if len(value) > cap:
        raise ValueError(f"{name}: {len(value)} entries, more than the cap of {cap}")
    return value


def check_id_map(document: dict, name: str, cap: int) -> dict[int, str]:
    """An object of decimal-id keys and string values (labels, object kinds)."""
    value = document.get(name, {})
    if type(value) is not dict:
        raise ValueError(f"{name}: expected an object, got {type(value).__name__}")
    if len(value) > cap:
        raise ValueError(f"{name}: {len(value)} entries, more than the cap of {cap}")
    out = {}
    for key, text in value.items():
        if not key.isdigit() or len(key) > 19:
            raise ValueError(f"{name}: key {key[:40]!r} is not an id")
        if type(text) is not str:
            raise ValueError(f"{name}[{key!r}]: expected a string")
        out[int(key)] = text
    return out
