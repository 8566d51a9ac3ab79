"""How traces display themselves in IPython: a `Trace` as its panel in a Jupyter kernel
(several: comparison tables and panels side by side), as its text report in a terminal IPython
or plain Python; a `WatchTrace` as its watch report. Also `show()`. The model never imports
views for this: `register_formatters` tells IPython how.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from IPython.display import display

from autograd_magic import api
from autograd_magic.model.trace import Trace
from autograd_magic.report.build import ReportOptions, report_of
from autograd_magic.report.model import DEFAULT_MAX_NODES, Report
from autograd_magic.views.text import render_text, render_watch_text
from autograd_magic.watch_trace import WatchTrace

BLOCK = "cell"  # what the reports call the traced code in IPython: a cell
# What IPython puts in a cell's namespace for itself: never a name of the user's tensors.
NOTEBOOK_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})


def report_for(trace: Trace, max_nodes: int = DEFAULT_MAX_NODES) -> Report:
    """The report of `trace` as a notebook shows it."""
    return report_of(trace, ReportOptions(block=BLOCK, max_nodes=max_nodes))


def _shell() -> Any:
    """The running IPython shell, or None outside IPython."""
    from IPython import get_ipython

    return get_ipython()


def register_formatters(shell: Any) -> None:
    """Make `Trace` objects render as their panel in `shell`, `WatchTrace` objects as their
    report (idempotent)."""
    api.NOT_USER_NAMES.update(NOTEBOOK_NAMES)  # a plain `with track():` in a cell too
    formatter = shell.display_formatter.mimebundle_formatter
    formatter.for_type(Trace, lambda trace: trace_bundle([("trace", trace)], shell))
    formatter.for_type(WatchTrace, watch_bundle)


def watch_bundle(watch: WatchTrace) -> dict[str, Any]:
    """A watched block's report: static HTML (steps, each capture window's full report) and
    text; outside a Jupyter kernel the text alone, as for a `Trace` (a terminal shows no HTML,
    and its pictures cost more than a long cell's counted steps)."""
    report = watch.report(block=BLOCK)
    text = render_watch_text(report)
    if not _in_kernel(_shell()):
        return {"text/plain": text}
    from autograd_magic.views.html import watch_page

    return {"text/html": watch_page(report), "text/plain": text}


def _in_kernel(shell: Any) -> bool:
    return getattr(shell, "kernel", None) is not None


def trace_bundle(named: Sequence[tuple[str, Trace]], shell: Any) -> dict[str, Any]:
    """The display bundle of one trace (its panel) or several (comparison and panels)."""
    from autograd_magic.views.report_html import comparison_text

    if len(named) == 1 and isinstance(named[0][1], WatchTrace):
        return watch_bundle(named[0][1])
    if not _in_kernel(shell):
        if len(named) == 1:
            return {"text/plain": render_text(report_for(named[0][1]))}
        return {"text/plain": comparison_text([(name, report_for(t)) for name, t in named])}
    from autograd_magic.views.panel import TracePanel, side_by_side_bundle

    if len(named) == 1:
        return TracePanel(named[0][1], block=BLOCK)._repr_mimebundle_()
    return side_by_side_bundle(named, BLOCK)


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


def _new_panel(trace: Trace, max_nodes: int) -> Any:
    """A panel for `trace` (live when a recorder calls its `live_update`)."""
    from autograd_magic.views import panel  # ipywidgets only when a panel is shown

    return panel.TracePanel(trace, max_nodes=max_nodes, block=BLOCK)


def show_cell_trace(
    trace: Trace,
    panel: Any,
    handle: Any,
    args: Any,
    error: BaseException | None,
    widgets: bool = True,
) -> None:
    """Display a `%%trackgraph` cell's finished trace: in a Jupyter kernel the panel and, as its
    own output, its static copy (what saved notebooks show anywhere); a watch's report; a
    rendering failure never hides the user's own error."""
    try:
        if not isinstance(trace, Trace):  # a watch: its report in place of the first steps' panel
            if args.text:
                print(trace_bundle([("watch", trace)], None)["text/plain"])
            elif panel is not None:
                handle.update(trace)
                panel.close()
            else:
                display(trace)
        elif args.text:
            print(render_text(report_for(trace, args.max_nodes)))
        elif not widgets:
            display(_new_panel(trace, args.max_nodes))  # a terminal prints the text report
        else:
            shown = panel is not None
            panel = panel or _new_panel(trace, args.max_nodes)
            panel.finish()
            static = panel.static_copy()  # sets the panel's bundle to widget + one-line text
            if shown:
                handle.update(panel)
            else:
                display(panel)
            display(static)
    except Exception as exc:
        if error is None:
            raise
        print(f"autograd_magic could not render the trace: {exc!r}", file=sys.stderr)
