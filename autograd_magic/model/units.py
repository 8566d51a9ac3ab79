"""Small shared helpers every layer reads: byte sizes, the traced code's line, node names."""

from __future__ import annotations

import re
from collections.abc import Mapping

from autograd_magic.model.records import Site

# The node autograd makes for a leaf that requires grad: never saves anything, never "leaks".
ACCUMULATE_GRAD = "AccumulateGrad"
# A layer number in a dotted path (`h.3.attn`, `layers.3[0]`): repeated layers differ only there.
LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=[.\[\]]|$)")


def layer_pattern(path: str) -> str:
    """`model.h.3.mlp` -> `model.h.*.mlp`: the repeated structure a path belongs to."""
    return LAYER_INDEX.sub("*", path)


def format_bytes(nbytes: int) -> str:
    """'512 B', '1.5 KiB', '12.0 MiB' (binary units; GiB is the largest)."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def cell_line(site: Site) -> int:
    """The line in the traced code (the cell or script), even for events inside a forward."""
    return site.outer_line if site.outer_line is not None else site.line


def where(site: Site | None) -> str:
    """'line 9' / 'line 9, in forward line 4' / '' for an unknown site."""
    if site is None or site.line == 0:
        return ""
    return site.describe()


def describe_error(error: BaseException) -> str:
    """`str(error)`, or a stand-in when the exception's own `__str__` raises (the user's
    exception must come out unchanged, whatever its text does)."""
    try:
        return str(error)
    except Exception:
        return f"<{type(error).__name__} whose text could not be read>"


def object_label(labels: Mapping[int, str], object_id: int) -> str:
    """The user's name for a tracked tensor or array, else its op label (`object#7`)."""
    return labels.get(object_id, f"object#{object_id}")
