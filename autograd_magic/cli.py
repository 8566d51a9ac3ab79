"""`python -m autograd_magic`: `run` a script under the recorder, `report` saved traces.

`run` behaves like `python script.py` (the script is `__main__`, `sys.argv` is what it expects,
same stdout, exit code and traceback) and adds the text report on stderr and a trace file.
Bad input (missing script or file, not a trace, newer format) is one line and exit code 2, with
nothing written.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback
import types
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autograd_magic.model.trace import Trace
    from autograd_magic.watch_trace import WatchTrace

USAGE_ERROR = 2


class UsageProblem(Exception):
    """Bad input from the command line: the message is printed as one line, exit code 2."""


def parser() -> argparse.ArgumentParser:
    """The command line's parser (subcommands `run` and `report`)."""
    return _parsers()[0]


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each subcommand's own, by name."""
    top = argparse.ArgumentParser(
        prog="python -m autograd_magic",
        description="Record what PyTorch autograd does with memory in scripts and jobs.",
    )
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a script under the recorder and save its trace")
    run.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="trace file ({rank} and {pid} are filled in; default SCRIPT.trace.json, "
        "SCRIPT.rank{rank}.trace.json under torchrun)",
    )
    run.add_argument("--html", metavar="PATH", help="also write the HTML report")
    run.add_argument("--quiet", action="store_true", help="no text report on stderr")
    run.add_argument(
        "--watch",
        action="store_true",
        help="count every step cheaply and capture in full only the first step and the steps "
        "where graphs pile up (for long runs); saves a watch file",
    )
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    report = sub.add_parser("report", help="render saved traces (several: side by side)")
    report.add_argument("paths", nargs="+", metavar="PATH", help="trace files")
    report.add_argument("--html", metavar="OUT", help="HTML file to write")
    report.add_argument("--text", action="store_true", help="print the text report")
    return top, {"run": run, "report": report}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the process exit code."""
    top, commands = _parsers()
    args, unknown = top.parse_known_args(argv)
    if unknown:  # told with the command's own usage, not the top level's
        commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        if args.command == "run":
            return run_script(args)
        return report(args)
    except UsageProblem as problem:
        print(f"autograd_magic: error: {problem}", file=sys.stderr)
        return USAGE_ERROR


# ----- run ----------------------------------------------------------------------------------
def default_output(script: str) -> str:
    """SCRIPT.trace.json in the working folder; one file per rank when several run."""
    stem = Path(script).stem
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return f"{stem}.rank{{rank}}.trace.json"
    return f"{stem}.trace.json"


def run_script(args: Any) -> int:
    """Run `args.script` as `__main__` under `track(save=...)`; the script's exit code."""
    from autograd_magic.api import track
    from autograd_magic.watching import watch

    path = Path(args.script)
    if not path.is_file():
        raise UsageProblem(f"{args.script}: no such script")
    filename = os.path.abspath(path)  # as Python names `python script.py`'s frames
    try:
        code = compile(path.read_bytes(), filename, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError) as error:
        if isinstance(error, SyntaxError):
            traceback.print_exception(type(error), error, None)
            return 1
        raise UsageProblem(f"{args.script}: cannot be read ({error})") from None
    output = args.output or default_output(args.script)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=filename, __builtins__=__builtins__, __cached__=None)
    saved = sys.argv, sys.path[0], sys.modules["__main__"]
    sys.argv = [args.script, *args.args]
    sys.path[0] = os.path.dirname(os.path.realpath(filename))
    sys.modules["__main__"] = module
    status = 0
    trace: Trace | WatchTrace | None = None
    try:
        if args.watch:
            with watch(save=output, home_code=code, namespace=module.__dict__) as watcher:
                trace = watcher.result
                exec(code, module.__dict__)
        else:
            with track(save=output, home_code=code, namespace=module.__dict__) as trace:
                exec(code, module.__dict__)
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException as error:  # reported like Python does, after the trace is saved
        # Through sys.excepthook, so a hook the script installed formats it as it would.
        tb = _from_script(error.__traceback__, code)
        sys.excepthook(type(error), error.with_traceback(tb), tb)
        status = 1
    finally:
        sys.argv, sys.path[0], sys.modules["__main__"] = saved
        sys.stdout.flush()
    if trace is not None:
        _after_run(trace, args, output)
    return status


def _exit_status(code: object) -> int:
    """The process status `sys.exit(code)` gives, printing a non-integer code as Python does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _from_script(tb: types.TracebackType | None, code: types.CodeType) -> Any:
    """The traceback from the script's own frame on (the runner's frames are not the user's)."""
    start = tb
    while start is not None and start.tb_frame.f_code is not code:
        start = start.tb_next
    return tb if start is None else start


def _after_run(trace: Any, args: Any, output: str) -> None:
    """The text report on stderr and the optional HTML; never changes the exit code."""
    from autograd_magic.saving import expand_path

    try:
        path = expand_path(output)
        if not args.quiet:
            from autograd_magic.views.report_html import text_of

            # The summary, findings and backward calls; the tables go in the full report.
            print(text_of(trace.report(), tables=False), file=sys.stderr, end="")
            print(f"autograd_magic: trace saved to {path}", file=sys.stderr)
            print(
                f"autograd_magic: module tree and tables: python -m autograd_magic report "
                f"{shlex.quote(str(path))} --text (or without --text, an HTML report)",
                file=sys.stderr,
            )
        if args.html:
            from autograd_magic.saving import run_info
            from autograd_magic.views.report_html import report_document

            html_path = expand_path(args.html)
            html_path.parent.mkdir(parents=True, exist_ok=True)
            name = trace_name(path, run_info())
            document = report_document([(name, trace.report())])
            html_path.write_text(document, encoding="utf-8")
            print(f"autograd_magic: report written to {html_path}", file=sys.stderr)
    except Exception as error:
        print(f"autograd_magic: could not report the trace: {error!r}", file=sys.stderr)


# ----- report -------------------------------------------------------------------------------
def trace_name(path: Path, run: dict[str, Any]) -> str:
    """How a report names a trace: its rank when it came from a job of several, and its file."""
    if int(run.get("world_size", 1) or 1) > 1:
        return f"rank {run.get('rank', '?')} ({path.name})"
    return path.name


def report(args: Any) -> int:
    """Load every trace first (any bad one: nothing written), then write/print the report."""
    from autograd_magic.saving import TraceFileError, load_trace_file

    named = []
    for name in args.paths:
        try:
            trace, run = load_trace_file(name)
        except TraceFileError as error:
            raise UsageProblem(str(error)) from None
        named.append((trace_name(Path(name), run), trace.report()))
    out = args.html
    if out is None and not args.text:
        out = _default_html(args.paths[0])
    if args.text:
        from autograd_magic.views.report_html import reports_text

        print(reports_text(named), end="")
    if out is not None:
        from autograd_magic.views.report_html import report_document

        target = Path(out)
        if target.is_dir():
            raise UsageProblem(f"{out}: is a folder; give a file name for the HTML report")
        title = "autograd_magic report: " + ", ".join(name for name, _ in named)
        document = report_document(named, title)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(document, encoding="utf-8")
        print(f"autograd_magic: report written to {target}", file=sys.stderr)
    return 0


def _default_html(first: str) -> str:
    name = Path(first).name
    stem = name[: -len(".json")] if name.endswith(".json") else name
    return stem + ".html"
