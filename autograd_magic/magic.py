"""Everything IPython about autograd_magic: the `%%trackgraph` cell magic, the await
transformer, and the last cell's trace (how traces display themselves is `display`).

Thin by design: the recorder (`api.track`) records, `views.panel` and `views.text` render; this
module decides what is shown and makes a failing cell fail exactly like a normal one, after
showing what was recorded. The await transformer (`await_cells`) runs a cell with top-level
`await` on the cell's own event loop. A `Trace` displays as its finished panel in a Jupyter
kernel (several traces: comparison tables and panels side by side), as its text report in a
terminal IPython or plain Python (`display.register_formatters`). No other module of the package
but `display` knows IPython: the notebook machinery's packages are named to
the recorder here (`sites.not_user_code`), so their frames never count as the user's line.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import keyword
import sys
from types import CodeType, FrameType, TracebackType
from typing import Any

from IPython.core.displayhook import DisplayHook
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from autograd_magic import watching
from autograd_magic.api import track
from autograd_magic.display import BLOCK, NOTEBOOK_NAMES, register_formatters, show_cell_trace
from autograd_magic.model.trace import Trace
from autograd_magic.model.watch import WatchOptions
from autograd_magic.recorder import Recorder, sites
from autograd_magic.report.model import DEFAULT_MAX_NODES

# Frames of the notebook machinery around a cell are never the user's line.
sites.not_user_code(("IPython", "ipykernel", "traitlets", "tornado", "zmq", "jupyter_client"))

DEFAULT_REFRESH_S = 1.0
# A cell records its first steps (backward calls) in full, then counts the rest and records in
# full the steps where graphs pile up: a short cell is recorded whole, a 1,000-step loop costs
# little more than the hooks (see the README, "Leave it on").
CELL_FULL_STEPS = 20


@magics_class
class TrackGraphMagics(Magics):
    """Holds `%%trackgraph`; registered by `%load_ext autograd_magic`."""

    @magic_arguments()
    @argument("-o", "--out", metavar="NAME", help="Store the Trace in the variable NAME.")
    @argument(
        "--max-nodes",
        type=int,
        default=DEFAULT_MAX_NODES,
        metavar="N",
        help=f"Draw at most N graph boxes; larger graphs are merged (default {DEFAULT_MAX_NODES}).",
    )
    @argument("--no-live", action="store_true", help="Render only when the cell has finished.")
    @argument("--text", action="store_true", help="Print the text report instead of the panel.")
    @argument(
        "--watch",
        action="store_true",
        help="Record only the first step in full; count the others cheaply and record in full "
        "the steps where graphs pile up (default: the first "
        f"{CELL_FULL_STEPS} steps in full).",
    )
    @argument(
        "--full",
        action="store_true",
        help="Record every step in full, however long the loop (slower on long loops).",
    )
    @argument(
        "--refresh",
        type=float,
        default=DEFAULT_REFRESH_S,
        metavar="SECONDS",
        help=f"Seconds between live panel updates (default {DEFAULT_REFRESH_S}).",
    )
    @cell_magic
    def trackgraph(self, line: str, cell: str) -> Any:
        """Run the cell under the autograd recorder and show what autograd did with memory.

        The panel shows live/peak autograd nodes and retained saved tensors, findings with their
        lines, a timeline, the graph, saved tensors, shared storage and in-place writes. Line 1
        is the first line after `%%trackgraph`. The last trace is `autograd_magic.last_trace()`.
        """
        __tracebackhide__ = True  # the user's traceback starts in their cell
        shell: Any = self.shell  # set once the magics are registered on a shell
        args, body, last = _prepare(shell, line, cell)
        is_async = _is_async(body) or (last is not None and _is_async(last))
        if is_async and _loop_running():
            # Only when called directly: the input transformer sends such cells to
            # `run_cell_async`, which the kernel awaits.
            raise UsageError(_AWAIT_MESSAGE)
        recorder, panel, handle = _start(shell, args, body)
        value, error = None, None
        try:
            with recorder:
                if is_async:
                    value = shell.loop_runner(_run_async(body, last, shell.user_ns))
                else:
                    exec(body, shell.user_ns)
                    if last is not None:
                        value = eval(last, shell.user_ns)
        except BaseException as exc:  # shown in the panel, then re-raised unchanged below
            error = exc
        finally:
            recorder.listen(None)
        return _end(shell, args, recorder.trace, panel, handle, value, error, (body, last))


async def run_cell_async(line: str, cell: str) -> Any:
    """`%%trackgraph` for a cell with top-level `await`, run on the event loop that runs the
    cell: `await_cells` rewrites such a cell into `await run_cell_async(line, cell)`."""
    __tracebackhide__ = True
    shell: Any = _shell()
    args, body, last = _prepare(shell, line, cell)
    recorder, panel, handle = _start(shell, args, body)
    value, error = None, None
    try:
        with recorder:
            value = await _run_async(body, last, shell.user_ns)
    except BaseException as exc:  # shown in the panel, then re-raised unchanged below
        error = exc
    finally:
        recorder.listen(None)
    return _end(shell, args, recorder.trace, panel, handle, value, error, (body, last))


def await_cells(lines: list[str]) -> list[str]:
    """IPython input transformer: a `%%trackgraph` cell with top-level `await` becomes
    `await ...run_cell_async(line, cell)`, so IPython runs it on its event loop as it runs a
    plain cell with `await` (a cell magic itself is always called synchronously)."""
    if not lines or not lines[0].startswith("%%trackgraph"):
        return lines
    name, _, line = lines[0][2:].rstrip().partition(" ")  # as IPython splits a cell magic
    shell: Any = _shell()
    if name != "trackgraph" or shell is None or not getattr(shell, "autoawait", False):
        return lines
    cell = "".join(lines[1:])
    try:
        source = shell.transform_cell(cell)
        code = compile(source, "<cell>", "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, True)
    except Exception:  # the magic reports the error as for any cell
        return lines
    if not _is_async(code):
        return lines
    call = f"run_cell_async({line!r}, {cell!r})"
    return [f"await __import__('autograd_magic.magic').magic.{call}\n"]


def _shell() -> Any:
    """The running IPython shell, or None outside IPython."""
    from IPython import get_ipython

    return get_ipython()


def _prepare(shell: Any, line: str, cell: str) -> tuple[Any, CodeType, CodeType | None]:
    """Options, and the cell compiled; a bad option or a syntax error stops here, before the
    cell runs, with the error shown as for a plain cell."""
    __tracebackhide__ = True
    args = _parse(TrackGraphMagics.trackgraph, line)
    try:
        body, last = _compile_cell(shell, cell)
    except SyntaxError as exc:
        # As for a plain cell: the error points into the cell, not at the magic's frames.
        raise exc.with_traceback(None) from None
    return args, body, last


def _start(shell: Any, args: Any, body: CodeType) -> tuple[Recorder, Any, Any]:
    """The cell's recorder (not entered yet) and, in a Jupyter kernel unless told otherwise,
    its live panel (`views.panel.live_panel`, fed by the recorder while it records) already on
    screen, so it shows before the cell's first op; (recorder, None, None) otherwise."""
    options = {"home_code": body, "namespace": shell.user_ns, "ignore_names": NOTEBOOK_NAMES}
    recorder: Any
    if args.full:
        recorder = live = track(**options)
    else:
        first = 1 if args.watch else CELL_FULL_STEPS
        recorder = watching.Watch(WatchOptions(first=first), **options)
        live = recorder.first_recorder
    panel, handle = None, None
    if not (args.no_live or args.text) and _widget_frontend(shell):
        from autograd_magic.views.panel import live_panel  # ipywidgets only for a panel

        panel = live_panel(live, args.refresh, args.max_nodes, BLOCK)
        if isinstance(recorder, watching.Watch):  # after the first steps: the status line
            recorder.listen_steps(panel.counted_update, args.refresh)
        handle = display(panel, display_id=True)
    return recorder, panel, handle


def _end(
    shell: Any,
    args: Any,
    trace: Trace,
    panel: Any,
    handle: Any,
    value: Any,
    error: BaseException | None,
    codes: tuple[CodeType | None, ...],
) -> Any:
    """Store and show the finished trace; then the cell's value, or its exception unchanged."""
    __tracebackhide__ = True
    global _last_trace
    _last_trace = trace
    if args.out:
        shell.user_ns[args.out] = trace
    show_cell_trace(trace, panel, handle, args, error, _widget_frontend(shell))
    if error is not None:
        raise error.with_traceback(_from_cell(error.__traceback__, codes))
    return value


def _parse(magic: Any, line: str) -> Any:
    """Parsed options, or a UsageError carrying the usage line (the cell is not run)."""
    usage = "usage: " + " ".join(magic.parser.format_usage().replace("::", "").split())
    try:
        args = parse_argstring(magic, line)
    except UsageError as exc:
        raise UsageError(f"{exc}\n{usage}") from None
    problem = None
    if args.out is not None and (not args.out.isidentifier() or keyword.iskeyword(args.out)):
        problem = f"-o/--out needs a variable name, not {args.out!r}"
    elif args.max_nodes < 1:
        problem = f"--max-nodes must be at least 1, not {args.max_nodes}"
    elif not args.refresh > 0:
        problem = f"--refresh must be a positive number of seconds, not {args.refresh}"
    if problem:
        raise UsageError(f"{problem}\n{usage}")
    return args


def _compile_cell(shell: Any, cell: str) -> tuple[CodeType, CodeType | None]:
    """The cell body compiled by IPython's compiler (tracebacks show its lines), and its last
    expression compiled separately so its value can be displayed like a normal cell's (none
    when the cell ends with `;`, IPython's rule, the expression then runs in the body).
    `ast_node_interactivity` is followed as IPython follows it: 'all' shows every expression
    statement's value as it runs, 'last' those of the last statement, 'last_expr_or_assign' a
    last assignment's, 'none' nothing."""
    source = shell.transform_cell(cell)
    filename = shell.compile.cache(source, _running_cell_number(shell), raw_code=cell)
    tree = shell.transform_ast(shell.compile.ast_parse(source, filename=filename))
    last = None
    # Top-level `await` compiles as in a plain IPython cell (the code is then a coroutine).
    flags = shell.compile.flags | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    quiet = DisplayHook.semicolon_at_end_of_expression(source)
    interactivity = getattr(shell, "ast_node_interactivity", "last_expr")
    if interactivity == "last_expr_or_assign" and tree.body:
        _show_assigned_name(tree.body)
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not quiet and interactivity != "none":
        last = compile(ast.Expression(tree.body.pop().value), filename, "eval", flags, True)
    elif tree.body and interactivity == "last":
        # The last statement runs as interactive input (a loop's expression statements show);
        # evaluated like a last expression, it gives None, which shows nothing more.
        last = compile(ast.Interactive(body=[tree.body.pop()]), filename, "single", flags, True)
    if interactivity == "all":
        # Compiled as interactive input, each expression statement calls sys.displayhook (the
        # shell's: `Out[n]`), as IPython runs each node of such a cell.
        interactive = ast.Interactive(body=tree.body)
        return compile(interactive, filename, "single", flags, True), last
    return compile(tree, filename, "exec", flags, True), last


def _show_assigned_name(body: list[ast.stmt]) -> None:
    """IPython's 'last_expr_or_assign': a last assignment to one name shows that name."""
    node = body[-1]
    target = None
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        target = node.target
    if isinstance(target, ast.Name):
        shown = ast.Expr(ast.Name(target.id, ast.Load()))
        body.append(ast.fix_missing_locations(ast.copy_location(shown, node)))


def _running_cell_number(shell: Any) -> int:
    """N of the In[N] that runs the magic, for the cell's tracebacks. IPython counts the cell
    before running it (`execution_count` is then N + 1), so read the caller's compiled name."""
    numbers = getattr(shell.compile, "_filename_map", None) or {}
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        number = numbers.get(frame.f_code.co_filename)
        if number is not None:
            return number
        frame = frame.f_back
    return shell.execution_count


def _is_async(code: CodeType) -> bool:
    return bool(code.co_flags & inspect.CO_COROUTINE)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _run_async(body: CodeType, last: CodeType | None, namespace: dict) -> Any:
    """The cell's body then its last expression, awaiting whichever is a coroutine."""
    __tracebackhide__ = True
    result = eval(body, namespace)
    if _is_async(body):
        await result
    if last is None:
        return None
    value = eval(last, namespace)
    return (await value) if _is_async(last) else value


_AWAIT_MESSAGE = (
    "%%trackgraph got a cell with top-level `await` through a direct call while an event loop "
    "is running (a magic is called synchronously). Run it as a `%%trackgraph` cell, which is "
    "awaited like a plain cell, or `await autograd_magic.magic.run_cell_async(line, cell)`."
)


def _widget_frontend(shell: Any) -> bool:
    """True in a Jupyter kernel, where a widget can be displayed first and updated live."""
    return getattr(shell, "kernel", None) is not None


def _from_cell(tb: TracebackType | None, codes: tuple[CodeType | None, ...]) -> Any:
    """The traceback from the cell's own frame on (the magic's frames are not the user's)."""
    start = tb
    while start is not None and start.tb_frame.f_code not in codes:
        start = start.tb_next
    return tb if start is None else start


# magic_arguments names the parser after the method ('%trackgraph'); this is a cell magic.
TrackGraphMagics.trackgraph.parser.prog = "%trackgraph"  # the formatter adds a "%"
TrackGraphMagics.trackgraph.__doc__ = TrackGraphMagics.trackgraph.parser.format_help()


def load(ipython: Any) -> None:
    """Register `%%trackgraph` on `ipython`, the transformer for cells with `await`, and the
    display of traces."""
    ipython.register_magics(TrackGraphMagics)
    register_formatters(ipython)
    cleanup = ipython.input_transformers_cleanup
    if await_cells not in cleanup:
        cleanup.append(await_cells)


def unload(ipython: Any) -> None:
    """Remove `%%trackgraph` from `ipython` (IPython has no unregister call)."""
    manager = ipython.magics_manager
    manager.magics["cell"].pop("trackgraph", None)
    manager.registry.pop(TrackGraphMagics.__name__, None)
    cleanup = ipython.input_transformers_cleanup
    while await_cells in cleanup:
        cleanup.remove(await_cells)


# ----- the last cell's trace ----------------------------------------------------------------
_last_trace: Trace | None = None


def last_trace() -> Trace | None:
    """The trace recorded by the most recent `%%trackgraph` cell, if any."""
    return _last_trace
