"""How traces display themselves in IPython: a formatter registered for `Trace` (so the model
never imports views), and `autograd_magic.show(*traces)`.

In a Jupyter kernel a trace shows the finished panel (with its static HTML and text fallbacks);
several traces show the comparison tables and their panels side by side. A terminal IPython, or
plain Python, gets the text report.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from autograd_magic.model.trace import Trace


def register_formatters(shell: Any) -> None:
    """Make `Trace` objects render as their panel in `shell` (idempotent)."""
    formatter = shell.display_formatter.mimebundle_formatter
    formatter.for_type(Trace, lambda trace: trace_bundle([("trace", trace)], shell))


def _in_kernel(shell: Any) -> bool:
    return getattr(shell, "kernel", None) is not None


def trace_bundle(named: Sequence[tuple[str, Trace]], shell: Any) -> dict[str, Any]:
    """The display bundle of one trace (its panel) or several (comparison and panels)."""
    from autograd_magic.views.report_html import comparison_text

    if not _in_kernel(shell):
        if len(named) == 1:
            from autograd_magic.views.text import render_text

            return {"text/plain": render_text(named[0][1])}
        return {"text/plain": comparison_text(named)}
    from autograd_magic.views.panel import TracePanel, side_by_side_bundle

    if len(named) == 1:
        return TracePanel(named[0][1])._repr_mimebundle_()
    return side_by_side_bundle(named)


def show(traces: Sequence[Trace], names: Sequence[str] | None = None) -> None:
    """Display `traces` in IPython, or print their text report outside it."""
    if not traces:
        raise TypeError("show() needs at least one Trace")
    for trace in traces:
        if not isinstance(trace, Trace):
            raise TypeError(f"show() takes Trace objects, not {type(trace).__name__}")
    if names is None:
        names = [f"trace {i + 1}" for i in range(len(traces))] if len(traces) > 1 else ["trace"]
    if len(names) != len(traces):
        raise ValueError(f"show() got {len(traces)} traces but {len(names)} names")
    named = list(zip(names, traces, strict=True))
    shell = _shell()
    if shell is None:
        print(trace_bundle(named, None)["text/plain"])
        return
    from IPython.display import publish_display_data

    publish_display_data(trace_bundle(named, shell))


def _shell() -> Any:
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()
