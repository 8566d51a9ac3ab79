"""The words of the findings about graphs kept after their use: kept-alive (a variable or
container holds them) and unused-graph (no backward used them, or a crash left them unused).
`autograd_magic.report.wording` keys them by fact class."""

from __future__ import annotations

from autograd_magic.analysis.findings.facts import (
    KeptChain,
    KeptContainer,
    Leftover,
    NeverReached,
    NoBackward,
    UnusedGraphs,
)
from autograd_magic.model.records import Site
from autograd_magic.model.units import cell_line, format_bytes
from autograd_magic.report.quotes import (
    at_line,
    called,
    freed_too,
    quoted_source,
    saved_bytes,
    which_graphs,
)


def kept_chain(f: KeptChain) -> str:
    assert f.built is not None
    advice = (
        f"Keep the value without its graph: `{f.fix}`"
        if f.fix
        else "Keep `.detach()` of what is added instead of the tensor itself"
    )
    # What following it saves, as measured: the chained graphs are freed step by step.
    advice += f";{freed_too('each graph is then freed after its backward', f.nbytes)}."
    return (
        f"`{f.holder}` keeps every iteration's graph alive: {at_line(f.line, f.built)}"
        f"{called(f.built)} adds "
        f"each new result to it, so {f.iterations:,} iterations' graphs ({len(f.node_ids):,} "
        f"nodes{saved_bytes(f.nbytes)}) are chained together and never freed."
        f"{kept_by_retain(f.retained_at)} {advice}"
    )


def kept_container(f: KeptContainer) -> str:
    assert f.built is not None
    roots, path = f.roots, f.holder
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
    taken = f"{at_line(f.line, f.reference)}{called(f.reference)} keeps " if f.reference else ""
    if f.used:
        fix = (
            "Keep `.item()` (a number) or `.detach()` of the value instead of the tensor "
            f"itself:{freed_too('each graph is then freed at its step', f.nbytes)}."
        )
    else:  # outputs no backward walked (inference with grad on): the graph was never needed
        never = freed_too("their graphs are never built", f.nbytes)
        fix = (
            "No backward used them: run the code that computes them under `torch.no_grad()` "
            f"(or `torch.inference_mode()`), so{never}; or keep `.detach()` of each."
        )
    return (
        f"`{path}` holds {what} ({len(f.node_ids):,} nodes{saved}): {taken}what line "
        f"{cell_line(f.built)}{quoted_source(f.built)} computed; the graphs stay in memory as "
        f"long as `{path}` does.{kept_by_retain(f.retained_at)} {fix}"
    )


def leftover(f: Leftover) -> str:
    assert f.built is not None and f.reference is not None
    return (
        f"`{f.holder}` still holds {f.results:,} results of line {f.line}"
        f"{quoted_source(f.built)} made after the last backward (line "
        f"{cell_line(f.reference)}): no backward used them, so they add nothing to the gradients "
        f"({len(f.node_ids):,} nodes{saved_bytes(f.nbytes)}) and are dropped when "
        f"`{f.holder}` is rebound. If a partial batch is left at the end of the loop, call "
        f"backward on it too."
    )


def held(f: UnusedGraphs) -> str:
    """' `first` still holds the first, `p` the last.': who holds which of the graphs."""
    if not f.held:
        return ""
    graphs = f.graphs
    holds = f.holds or ((f.holder, (graphs - 1,)),)
    said = [f"`{path}` {which_graphs(ranks, graphs)}" for path, ranks in holds[:3]]
    return (
        " " + said[0].replace("` ", "` still holds ", 1) + "".join(f", {s}" for s in said[1:]) + "."
    )


def no_backward(f: NoBackward) -> str:
    assert f.built is not None
    if f.crashed is not None:
        return left_by_crash(f, f.crashed) + held(f)
    graphs = f.graphs
    return (
        f"Line {f.line}{quoted_source(f.built)} built {graphs:,} autograd graph"
        f"{'s' if graphs > 1 else ''} that no backward used, saving up to "
        f"{format_bytes(f.nbytes)} of tensors each for a backward that never came. For "
        f"inference, run it under `with torch.no_grad():` (or `torch.inference_mode()`); if you "
        f"call backward later, in another cell, ignore this.{held(f)}"
    )


def never_reached(f: NeverReached) -> str:
    assert f.built is not None
    if f.crashed is not None:
        return left_by_crash(f, f.crashed) + held(f)
    graphs, where = f.graphs, f.freed_at
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
        f"{held(f)}"
    )


def left_by_crash(f: UnusedGraphs, crashed: Site) -> str:
    """The words of graphs a crash left unused: a consequence of the error, fixed with it."""
    assert f.built is not None
    many = f.graphs > 1
    return (
        f"{f.graphs:,} graph{'s' if many else ''} built at line {f.line}"
        f"{quoted_source(f.built)} {'were' if many else 'was'} left unused: the error at line "
        f"{cell_line(crashed)} ended the step before a backward reached "
        f"{'them' if many else 'it'}, holding up to {format_bytes(f.nbytes)} of saved tensors "
        f"until {'they are' if many else 'it is'} freed. This follows from the error; fixing "
        f"its cause fixes this too."
    )


def kept_by_retain(retained_at: Site | None) -> str:
    """' Their saved tensors are there because backward(retain_graph=True) at line 9 (the
    first finding) kept them.', or '' when no retain kept them."""
    if retained_at is None:
        return ""
    return (
        f" Their saved tensors are there because backward(retain_graph=True) at line "
        f"{cell_line(retained_at)} (the first finding) kept them: without it only the nodes "
        f"would stay."
    )
