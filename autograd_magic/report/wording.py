"""Findings in words: the one place that turns a `Fact` into the sentence a user reads and that
quotes source lines. The panel, HTML, text and the command line all show these sentences.

`analyze(trace)` is what a `track()` block runs when it ends: facts from the analysis, worded
into the `Finding` records the trace stores (and its JSON keeps).
"""

from __future__ import annotations

import io
import linecache
import tokenize
from collections.abc import Callable, Iterable

from autograd_magic.analysis.findings import Fact, SavedBy, find_facts
from autograd_magic.model.records import Finding, Site
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import cell_line, format_bytes

CARRIED_VALUE = "the carried value"  # a carried value no variable is known to hold
INPLACE_ERROR = (
    "'one of the variables needed for gradient computation has been modified by an inplace "
    "operation'"
)


def analyze(trace: Trace) -> list[Finding]:
    """The findings of a finished trace, worded, root cause first."""
    return [finding(fact) for fact in find_facts(trace)]


def finding(fact: Fact) -> Finding:
    """The `Finding` record for `fact`: its sentence plus the lines and holder it names."""
    holder = fact.holder
    if fact.kind == "graph-growth" and holder is None:
        holder = CARRIED_VALUE
    message = _WORDS[fact.kind, fact.form](fact)
    return Finding(fact.kind, message, fact.line, fact.related_lines, holder, fact.nbytes)


# ----- source quotes and lists --------------------------------------------------------------
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
        return f" (in {site.function} line {site.line}: `{text}`)"
    return f" (`{text}`)"


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


def _carried_name(cause: Fact) -> str:
    return cause.holder or CARRIED_VALUE


def because(cause: Fact | None) -> str:
    """'Because `h` carries the previous iteration's graph (line 16), ' or '' without a cause."""
    if cause is None:
        return ""
    return (
        f"Because `{_carried_name(cause)}` carries the previous iteration's graph (line "
        f"{cause.line}, the first finding), "
    )


def detached(holder: str, is_tuple: bool) -> str:
    """`h = h.detach()`, or the tuple form for a tuple such as an LSTM's (h, c)."""
    if is_tuple:
        return f"{holder} = tuple(t.detach() for t in {holder})"
    return f"{holder} = {holder}.detach()"


def _saved(saved: SavedBy) -> str:
    who = " and ".join(saved.owners) if saved.owners else "autograd"
    if saved.modules:
        # Inside a model the line is the one calling `model(...)`: the module says where.
        who += f" (in {name_list((f'`{m}`' for m in saved.modules), 'modules')})"
    return f"{who} saved for backward at {line_list(saved.lines)}"


def _saved_bytes(nbytes: int) -> str:
    return ", " + format_bytes(nbytes) + " saved" if nbytes else ""


# ----- kept-alive and unused-graph ----------------------------------------------------------
def at_line(line: int | None, site: Site | None) -> str:
    """'line 9 (`code`)', or for a line inside a function called from the traced code
    'line 4 of `forward`, called at line 9 (`code`)': each line said once."""
    where = f"line {line}"
    if site is not None and site.outer_line not in (None, site.line):
        where += f" of `{site.function}`, called at line {site.outer_line}"
    return where + quoted_code(site)


def _kept_chain(f: Fact) -> str:
    assert f.built is not None
    fix = f.detail.get("fix")
    advice = (
        f"Keep the value without its graph: `{fix}`."
        if fix
        else "Keep `.detach()` of what is added instead of the tensor itself."
    )
    return (
        f"`{f.holder}` keeps every iteration's graph alive: {at_line(f.line, f.built)} adds "
        f"each new result to it, so {f.iterations:,} iterations' graphs ({len(f.node_ids):,} "
        f"nodes{_saved_bytes(f.nbytes)}) are chained together and never freed. {advice}"
    )


def _kept_container(f: Fact) -> str:
    assert f.built is not None
    roots, path = f.detail["roots"], f.holder
    saved = (
        f", {format_bytes(f.nbytes)} of saved tensors"
        if f.nbytes
        else "; a backward already released their saved tensors, so only the nodes remain"
    )
    what = (
        f"{roots:,} tensors that still carry their autograd graphs"
        if roots > 1
        else "a tensor that still carries its autograd graph"
    )
    taken = f"{at_line(f.line, f.reference)} keeps " if f.reference else ""
    if f.detail.get("used", True):
        fix = "Keep `.item()` (a number) or `.detach()` of the value instead of the tensor itself."
    else:  # outputs no backward used: the graph was never needed
        fix = (
            "No backward used them: compute them under `torch.no_grad()`, or keep "
            "`.detach()` of each."
        )
    return (
        f"`{path}` holds {what} ({len(f.node_ids):,} nodes{saved}): {taken}what line "
        f"{cell_line(f.built)}{quoted_source(f.built)} computed; the graphs stay in memory as "
        f"long as `{path}` does. {fix}"
    )


def _leftover(f: Fact) -> str:
    assert f.built is not None and f.reference is not None
    return (
        f"`{f.holder}` still holds {f.detail['results']:,} results of line {f.line}"
        f"{quoted_source(f.built)} made after the last backward (line "
        f"{cell_line(f.reference)}): no backward used them, so they add nothing to the gradients "
        f"({len(f.node_ids):,} nodes{_saved_bytes(f.nbytes)}) and are dropped when "
        f"`{f.holder}` is rebound. If a partial batch is left at the end of the loop, call "
        f"backward on it too."
    )


def _held(f: Fact) -> str:
    """' `first` still holds the first, `p` the last.': who holds which of the graphs."""
    if not f.detail["held"]:
        return ""
    graphs = f.detail["graphs"]
    holds = f.detail.get("holds") or {f.holder: [graphs - 1]}
    said = [f"`{path}` {_which(ranks, graphs)}" for path, ranks in list(holds.items())[:3]]
    return (
        " " + said[0].replace("` ", "` still holds ", 1) + "".join(f", {s}" for s in said[1:]) + "."
    )


def _which(ranks: list[int], graphs: int) -> str:
    """Which of `graphs` graphs (by building order) `ranks` are, in words."""
    if graphs == 1:
        return "it"
    if len(ranks) > 1:
        return "all of them" if len(ranks) == graphs else f"{len(ranks):,} of them"
    rank = ranks[0]
    return "the last" if rank == graphs - 1 else "the first" if rank == 0 else f"graph {rank + 1:,}"


def _no_backward(f: Fact) -> str:
    assert f.built is not None
    graphs = f.detail["graphs"]
    return (
        f"Line {f.line}{quoted_source(f.built)} built {graphs:,} autograd graph"
        f"{'s' if graphs > 1 else ''} that no backward used, saving up to "
        f"{format_bytes(f.nbytes)} of tensors each for a backward that never came. For "
        f"inference, run it under `with torch.no_grad():` (or `torch.inference_mode()`); if you "
        f"call backward later, in another cell, ignore this.{_held(f)}"
    )


def _never_reached(f: Fact) -> str:
    assert f.built is not None
    graphs, where = f.detail["graphs"], f.detail["freed_at"]
    many = graphs > 1
    when = (
        f", {'most ' if many else ''}at line {where}, when the value holding it was rebound or "
        "dropped"
        if where
        else ""
    )
    return (
        f"{graphs:,} graph{'s' if many else ''} built at line {f.line}"
        f"{quoted_source(f.built)} never reached a backward; {'each' if many else 'it'} was "
        f"freed with its output{when}, holding up to {format_bytes(f.nbytes)} of saved tensors "
        f"until then. If you only need those values, compute them under `torch.no_grad()`."
        f"{_held(f)}"
    )


# ----- graph-growth, retained-graph, backward-through-freed ---------------------------------
def _growth(f: Fact) -> str:
    assert f.built is not None and f.reference is not None
    holder, grew = _carried_name(f), f.detail["grew"]
    grew_text = (
        f", and the graph grew from {grew[0]} to {grew[1]} nodes over {grew[2]:,} backward calls"
        if grew
        else ""
    )
    return (
        f"Each iteration's graph links to the previous one through `{holder}`, carried at line "
        f"{f.line}{quoted_source(f.built)}: the backward at line {cell_line(f.reference)} walked "
        f"{f.detail['earlier_nodes']} nodes from earlier iterations{grew_text}. Detach the "
        f"carried value once per iteration, before it is used again: "
        f"`{detached(holder, f.detail['tuple'])}`"
        + _once_detached(f.detail["retain"], f.detail["writes_hit_saved"])
    )


def _once_detached(retain: bool, writes_hit_saved: bool) -> str:
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


def _retained(f: Fact) -> str:
    assert f.reference is not None
    times = f.detail["times"]
    keeper = f" as long as `{f.holder}` is alive" if f.holder else " until the graph is dropped"
    kept_text = (
        f"{format_bytes(f.nbytes)} of saved tensors ({len(f.buffer_ids):,} buffers, saved at "
        f"{line_list(f.related_lines)}) that no later backward released; they stay in "
        f"memory{keeper}."
    )
    call_text = f.reference.describe() + quoted_code(f.reference, times)
    if f.cause is not None:
        return (
            f"{because(f.cause)}each backward reaches back into it, which is why "
            f"backward(retain_graph=True) at {call_text} seemed needed. It kept {kept_text} "
            f"Once `{_carried_name(f.cause)}` is detached, drop retain_graph=True."
        )
    return (
        f"backward(retain_graph=True) at {call_text} kept {kept_text} If you "
        f"backpropagate once, drop retain_graph=True; for several losses, sum them and "
        f"call backward once."
    )


def _freed_twice(fix: Callable[[Fact], str]) -> Callable[[Fact], str]:
    def words(f: Fact) -> str:
        assert f.reference is not None
        who = f"`{f.holder}.backward()`" if f.holder else "The backward"
        saved, built = f.detail["saved_lines"], f.detail["built_lines"]
        if saved:
            needs = f"tensors saved at {line_list(saved)}"
        else:  # e.g. a Python number saved by `2 * x`: saved-tensor hooks never see those
            needs = f"the graph built at {line_list(built)}" if built else "a graph"
        releaser: Site | None = f.detail["releaser"]
        if releaser is None:
            earlier = "an earlier backward"
        else:
            again = " (an earlier run of that line)" if releaser == f.reference else ""
            earlier = f"the backward at {releaser.describe()}{again}"
        return (
            f"{who} at {f.reference.describe()} needs {needs} that {earlier} already freed (a "
            f"backward frees the saved tensors of the graph it walks). {fix(f)}"
        )

    return words


def _fix_two_losses(f: Fact) -> str:
    first, name, releaser = f.detail["first"], f.holder, f.detail["releaser"]
    total = f"({first} + {name})" if first and name and first != name else "(loss1 + loss2)"
    return (
        f"Passing retain_graph=True at line {cell_line(releaser)} would keep them (and "
        f"their memory) until this call; the usual better fix is one backward over the sum, "
        f"`{total}.backward()`."
    )


def _fix_carried(f: Fact) -> str:
    return (
        f"The shared part is a value carried across iterations (line "
        f"{f.detail['carried_line']}): detach it once per iteration "
        f"(`{detached(f.detail['carried'], f.detail['tuple'])}`) rather than passing "
        "retain_graph=True, which would keep every iteration's graph alive."
    )


def _fix_kept_container(f: Fact) -> str:
    container = f.detail["container"]
    return (
        f"The freed part is reached through `{container}`, which still holds results of "
        f"iterations an earlier backward already used: empty it after each backward "
        f"(`del {container}[:]`), so each loss is built only from the current iteration."
    )


def _fix_unshared(f: Fact) -> str:
    return (
        "Pass retain_graph=True to the earlier backward, or sum the losses and call backward once."
    )


def _fix_built_once(f: Fact) -> str:
    widest = f.detail["widest"]
    value = f"`{widest}`" if widest else "it"
    return (
        f"The shared part was built once ({line_list(f.detail['built_lines'])}) and is "
        f"reused by every later backward: if no gradient should flow into it, detach "
        f"{value} (or build it under `torch.no_grad()`); if one should, rebuild it before each "
        "backward."
    )


# ----- writes -------------------------------------------------------------------------------
def _inplace(f: Fact) -> str:
    assert f.reference is not None
    fix = f.detail.get("fix")
    advice = (
        f"Use the out-of-place form, `{fix}`, or `.clone()` the tensor before writing to it."
        if fix
        else "Use the out-of-place form of the operation (inplace=False for a layer), or "
        "`.clone()` the tensor before writing to it."
    )
    return (
        f"In-place `{f.detail['op']}` on `{f.holder}` at {at_line(f.line, f.reference)} changed "
        f"a tensor that {_saved(f.detail['saved'])}; {_then(f)}. {advice}"
    )


def _then(f: Fact, why: str = "") -> str:
    """What follows from a write to a saved tensor: why the backward that failed did (`why`
    adds the reason), or that a backward through that graph will fail."""
    failed = f.detail.get("failed")
    # When the backward already failed, its error says PyTorch's text: say why, not it again.
    if failed is not None:
        return f"that is why the backward at line {failed} failed{why}"
    return f"a backward through that graph will fail with {INPLACE_ERROR}"


def _optimizer_step(f: Fact) -> str:
    assert f.reference is not None
    labels = f.detail["labels"]
    names = name_list(labels, "parameters")
    what = f"`{names}`" if len(labels) == 1 else names
    done = (
        f"the optimizer step at line {f.line}{quoted_source(f.reference)} updated {what} in "
        f"place, tensors that {_saved(f.detail['saved'])}"
    )
    if f.cause is not None:
        return (
            f"{because(f.cause)}the next backward reaches back into that graph: {done}, so it "
            f"fails with {INPLACE_ERROR}. Detaching `{_carried_name(f.cause)}` fixes this too."
        )
    then = _then(f, ": the graph it walks was built before the step")
    return (
        f"{done[0].upper()}{done[1:]}; {then}. The optimizer updated the weights while a "
        f"retained graph still needs their old values: run every backward before "
        f"optimizer.step(), or redo the forward after it (recompute what you backpropagate)."
    )


def _shared_write(f: Fact) -> str:
    assert f.reference is not None
    sharers = f.detail["sharers"]
    others = ", ".join(f"`{s}`" + (f" ({how})" if how else "") for s, how in sharers)
    return (
        f"In-place `{f.detail['op']}` on `{f.holder}` at line {f.line}"
        f"{quoted_source(f.reference)} also changed {others}, which "
        f"{'share' if len(sharers) > 1 else 'shares'} memory with `{f.holder}`. If the old "
        f"values were meant to stay, copy first with `.clone()` (tensors) or `.copy()` (NumPy "
        f"arrays)."
    )


def _bypass(numpy: bool) -> Callable[[Fact], str]:
    def words(f: Fact) -> str:
        assert f.reference is not None
        target = f"`{f.holder}`" if f.holder else "a tensor"
        written = f.detail["written"]
        if numpy:
            how = f"NumPy array `{written}` was written (seen at line {f.line})"
        else:
            how = (
                f"`{written}` was written at line {f.line}{quoted_source(f.reference)} through "
                f"`.data`"
            )
        return (
            f"{how}, changing {target} without bumping its version counter, after "
            f"{_saved(f.detail['saved'])}: backward will use the new values without any error, "
            f"so gradients may be silently wrong. Make the change before the forward pass, or "
            f"write under torch.no_grad() without `.data` so autograd's check can see it."
        )

    return words


_WORDS: dict[tuple[str, str], Callable[[Fact], str]] = {
    ("kept-alive", "chain"): _kept_chain,
    ("kept-alive", "container"): _kept_container,
    ("graph-growth", "carried"): _growth,
    ("retained-graph", "retained"): _retained,
    ("backward-through-freed", "two-losses"): _freed_twice(_fix_two_losses),
    ("backward-through-freed", "carried"): _freed_twice(_fix_carried),
    ("backward-through-freed", "kept-container"): _freed_twice(_fix_kept_container),
    ("backward-through-freed", "unshared"): _freed_twice(_fix_unshared),
    ("backward-through-freed", "built-once"): _freed_twice(_fix_built_once),
    ("inplace-on-saved", "write"): _inplace,
    ("inplace-on-saved", "optimizer-step"): _optimizer_step,
    ("shared-write", "write"): _shared_write,
    ("data-bypass", "data"): _bypass(numpy=False),
    ("data-bypass", "numpy"): _bypass(numpy=True),
    ("unused-graph", "leftover"): _leftover,
    ("unused-graph", "no-backward"): _no_backward,
    ("unused-graph", "never-reached"): _never_reached,
}
