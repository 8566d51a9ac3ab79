"""The pieces finding sentences are made of: quotes of the user's source lines, line and name
lists, who saved a tensor, a detach to copy, and the phrases several forms share (the root
cause, what a write to a saved tensor leads to). `autograd_magic.report.wording` puts them
together.
"""

from __future__ import annotations

import io
import linecache
import os
import re
import tokenize
from collections.abc import Iterable

from autograd_magic.analysis.findings.facts import GraphGrowth, SavedBy
from autograd_magic.model.records import Site
from autograd_magic.model.units import format_bytes

CARRIED_VALUE = "the carried value"  # a carried value no variable is known to hold
INPLACE_ERROR = (
    "'one of the variables needed for gradient computation has been modified by an inplace "
    "operation'"
)


def source_of(site: Site) -> str:
    """The source text of a site's line without its comment, or '' when the file is not
    available."""
    return without_comment(linecache.getline(site.file, site.line).strip())


def without_comment(line: str) -> str:
    """`line` with its trailing `# comment` cut (a `#` inside a string stays)."""
    if "#" not in line:
        return line
    try:
        for token in tokenize.generate_tokens(io.StringIO(line).readline):
            if token.type == tokenize.COMMENT:
                return line[: token.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):  # a line of a longer statement
        pass
    return line


def quoted_code(site: Site | None, times: int = 1) -> str:
    """' (`code`)' for a site already described with its function line; with `times` over one,
    ' (`code`, called 3 times)' (or ' (called 3 times)' when the source is not available)."""
    parts = [f"`{text}`"] if site is not None and (text := source_of(site)) else []
    if times > 1:
        parts.append(f"called {times:,} times")
    return f" ({', '.join(parts)})" if parts else ""


def quoted_source(site: Site) -> str:
    """' (`code`)' after a cell line; for code inside a function the quote says where it is,
    since the cell line (a call) and the quoted line differ."""
    text = source_of(site)
    if not text:
        return ""
    if site.outer_line is not None and site.outer_line != site.line:
        return f" (line {site.line} in {site.function}: `{text}`)"
    return f" (`{text}`)"


def called(site: Site | None) -> str:
    """',' after `at_line` of a line inside a function ('..., called at line 9,'), else ''."""
    return "," if site is not None and site.outer_line not in (None, site.line) else ""


def at_line(
    line: int | None, site: Site | None, scope: str | None = None, quote: bool = True
) -> str:
    """'line 9 (`code`)'; for a line inside a function called from the traced code, 'line 4
    of `forward` (`code`), called at line 9' (`scope` given, the function is said already:
    'line 4 (`code`), called at line 9'); where the finding points at the call `line` because
    the function is written elsewhere, 'line 4 of `forward` in cell In [3] (`code`), called at
    line 9'. Each line said once, the quote (left out with `quote` False) beside the line it
    quotes."""
    code = quoted_code(site) if quote else ""
    if site is None or site.outer_line in (None, site.line):
        return f"line {line}{code}"
    function = "" if scope else f" of `{site.function}`"
    place = "" if line == site.line else f" in {place_of(site.file)}"
    return f"line {site.line}{function}{place}{code}, called at line {site.outer_line}"


def place_of(file: str) -> str:
    """Where a file of the user's code is, in words: 'In [3]' for an IPython cell whose number
    its name says, 'an earlier cell' for another cell, else the file's name."""
    numbered = re.fullmatch(r"<ipython-input-(\d+)-\w+>", file)
    if numbered:
        return f"cell In [{numbered.group(1)}]"
    if re.search(r"ipykernel_\d+[/\\]\d+\.py$", file):
        return "an earlier cell"
    return f"`{os.path.basename(file)}`"


def line_list(lines: Iterable[int]) -> str:
    """'line 4', 'lines 1 and 2', 'lines 1, 2 and 3', or 'lines 1, 2, 3, ... 9' for many."""
    ordered = sorted(set(lines))
    if len(ordered) == 1:
        return f"line {ordered[0]}"
    if len(ordered) > 4:
        return "lines " + ", ".join(str(x) for x in ordered[:3]) + f", ... {ordered[-1]}"
    return "lines " + ", ".join(str(x) for x in ordered[:-1]) + f" and {ordered[-1]}"


def name_list(names: Iterable[str], noun: str) -> str:
    """'a, b, c' or 'a, b, ... (5 parameters)' for many names of one kind."""
    unique = list(dict.fromkeys(names))
    if len(unique) <= 3:
        return ", ".join(unique)
    return f"{unique[0]}, {unique[1]}, ... ({len(unique):,} {noun})"


def detached(holder: str, is_tuple: bool) -> str:
    """`h = h.detach()`, or the tuple form for a tuple such as an LSTM's (h, c)."""
    if is_tuple:
        return f"{holder} = tuple(t.detach() for t in {holder})"
    return f"{holder} = {holder}.detach()"


def saved_by(saved: SavedBy, called_at: int | None = None) -> str:
    """'MmBackward0 (in `model.fc`) saved for backward at line 3', or '... saved for backward
    in that call' when it is the call at line `called_at` the sentence has just named."""
    who = " and ".join(saved.owners) if saved.owners else "autograd"
    if saved.modules:
        # Inside a model the line is the one calling `model(...)`: the module says where.
        who += f" (in {name_list((f'`{m}`' for m in saved.modules), 'modules')})"
    if called_at is not None and saved.lines == (called_at,):
        return f"{who} saved for backward in that call"
    return f"{who} saved for backward at {line_list(saved.lines)}"


def freed_too(what: str, nbytes: int) -> str:
    """' what, these 2.2 KiB of saved tensors included' (what a fix frees, as measured), or
    ' what' when nothing saved was measured."""
    return (
        f" {what}, these {format_bytes(nbytes)} of saved tensors included" if nbytes else f" {what}"
    )


def saved_bytes(nbytes: int) -> str:
    """', 4.0 KiB saved', or '' for nothing saved."""
    return ", " + format_bytes(nbytes) + " saved" if nbytes else ""


# ----- phrases several forms share ---------------------------------------------------------
def carried_name(cause: GraphGrowth) -> str:
    """The carried variable's name, or 'the carried value' when no variable is known."""
    return cause.holder or CARRIED_VALUE


def because(cause: GraphGrowth | None) -> str:
    """'Because `h` carries the previous iteration's graph (line 16), ' or '' without a cause."""
    if cause is None:
        return ""
    return (
        f"Because `{carried_name(cause)}` carries the previous iteration's graph (line "
        f"{cause.line}, the first finding), "
    )


def which_graphs(ranks: tuple[int, ...], graphs: int) -> str:
    """Which of `graphs` graphs (by building order) `ranks` are, in words."""
    if graphs == 1:
        return "it"
    if len(ranks) > 1:
        return "all of them" if len(ranks) == graphs else f"{len(ranks):,} of them"
    rank = ranks[0]
    return "the last" if rank == graphs - 1 else "the first" if rank == 0 else f"graph {rank + 1:,}"


def once_detached(retain: bool, writes_hit_saved: bool) -> str:
    """What detaching also fixes: the retain_graph workaround, and in-place updates (an
    optimizer step) that broke the next backward, each only when it happened."""
    if not retain:
        return "."
    if writes_hit_saved:
        return (
            "; then retain_graph=True is no longer needed and the optimizer's updates no longer "
            "break the next backward."
        )
    return "; then retain_graph=True is no longer needed."


def then_fails(failed: int | None, why: str = "") -> str:
    """What follows from a write to a saved tensor: why the backward at line `failed` failed
    (`why` adds the reason), or that a backward through that graph will fail."""
    # When the backward already failed, its error says PyTorch's text: say why, not it again.
    if failed is not None:
        return f"that is why the backward at line {failed} failed{why}"
    return f"a backward through that graph will fail with {INPLACE_ERROR}"
