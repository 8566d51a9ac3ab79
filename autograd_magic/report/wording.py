"""Findings in words: the one place that turns a fact into the sentence a user reads. The
panel, HTML, text and the command line all show these sentences.

Each fact class has its wording function in `_WORDS`, checked complete at import, so a form
without words fails at once, not the day it occurs. The quotes and lists the sentences are made
of live in `autograd_magic.report.quotes`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from autograd_magic.analysis.findings.facts import (
    FACT_TYPES,
    DataUpdate,
    DataWrite,
    Fact,
    FreedBuiltOnce,
    FreedByGrad,
    FreedByTwoLosses,
    FreedCarried,
    FreedKeptContainer,
    FreedTwice,
    FreedUnshared,
    GraphGrowth,
    InplaceWrite,
    KeptChain,
    KeptContainer,
    Leftover,
    LibraryWrite,
    NeverReached,
    NoBackward,
    NumpyWrite,
    OptimizerStep,
    RetainedGraph,
    SharedWrite,
    UnusedGraphs,
)
from autograd_magic.analysis.live import NodeGrowth, built_line
from autograd_magic.model.records import Finding
from autograd_magic.model.units import cell_line, format_bytes
from autograd_magic.report import write_wording
from autograd_magic.report.fixes import (
    fix_built_once,
    fix_by_grad,
    fix_carried,
    fix_kept_container,
    fix_two_losses,
    fix_unshared,
    growth_fix,
)
from autograd_magic.report.model import Sentence
from autograd_magic.report.quotes import (
    CARRIED_VALUE,
    INPLACE_ERROR,
    at_line,
    because,
    carried_name,
    freed_too,
    line_list,
    name_list,
    quoted_code,
    quoted_source,
    saved_bytes,
    which_graphs,
)

F = TypeVar("F", bound=Fact)

__all__ = ["CARRIED_VALUE", "INPLACE_ERROR", "finding", "growth_finding", "words_of"]


def finding(fact: Fact) -> Finding:
    """The `Finding` record for `fact`: its sentence plus the lines and holder it names."""
    holder = fact.holder
    if isinstance(fact, GraphGrowth) and holder is None:
        holder = CARRIED_VALUE
    message = words_of(type(fact))(fact)
    return Finding(fact.kind, message, fact.line, fact.related_lines, holder, fact.nbytes)


def words_of(cls: type[Fact]) -> Callable[[Any], str]:
    """The wording function of a fact class; KeyError for a class that is not a form."""
    return _WORDS[cls]


# ----- kept-alive and unused-graph ----------------------------------------------------------
def _kept_chain(f: KeptChain) -> str:
    assert f.built is not None
    advice = (
        f"Keep the value without its graph: `{f.fix}`"
        if f.fix
        else "Keep `.detach()` of what is added instead of the tensor itself"
    )
    # What following it saves, as measured: the chained graphs are freed step by step.
    advice += f";{freed_too('each graph is then freed after its backward', f.nbytes)}."
    return (
        f"`{f.holder}` keeps every iteration's graph alive: {at_line(f.line, f.built)} adds "
        f"each new result to it, so {f.iterations:,} iterations' graphs ({len(f.node_ids):,} "
        f"nodes{saved_bytes(f.nbytes)}) are chained together and never freed. {advice}"
    )


def _kept_container(f: KeptContainer) -> str:
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
    taken = f"{at_line(f.line, f.reference)} keeps " if f.reference else ""
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
        f"long as `{path}` does. {fix}"
    )


def _leftover(f: Leftover) -> str:
    assert f.built is not None and f.reference is not None
    return (
        f"`{f.holder}` still holds {f.results:,} results of line {f.line}"
        f"{quoted_source(f.built)} made after the last backward (line "
        f"{cell_line(f.reference)}): no backward used them, so they add nothing to the gradients "
        f"({len(f.node_ids):,} nodes{saved_bytes(f.nbytes)}) and are dropped when "
        f"`{f.holder}` is rebound. If a partial batch is left at the end of the loop, call "
        f"backward on it too."
    )


def _held(f: UnusedGraphs) -> str:
    """' `first` still holds the first, `p` the last.': who holds which of the graphs."""
    if not f.held:
        return ""
    graphs = f.graphs
    holds = f.holds or ((f.holder, (graphs - 1,)),)
    said = [f"`{path}` {which_graphs(ranks, graphs)}" for path, ranks in holds[:3]]
    return (
        " " + said[0].replace("` ", "` still holds ", 1) + "".join(f", {s}" for s in said[1:]) + "."
    )


def _no_backward(f: NoBackward) -> str:
    assert f.built is not None
    graphs = f.graphs
    return (
        f"Line {f.line}{quoted_source(f.built)} built {graphs:,} autograd graph"
        f"{'s' if graphs > 1 else ''} that no backward used, saving up to "
        f"{format_bytes(f.nbytes)} of tensors each for a backward that never came. For "
        f"inference, run it under `with torch.no_grad():` (or `torch.inference_mode()`); if you "
        f"call backward later, in another cell, ignore this.{_held(f)}"
    )


def _never_reached(f: NeverReached) -> str:
    assert f.built is not None
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
        f"{_held(f)}"
    )


# ----- graph-growth, retained-graph, backward-through-freed ---------------------------------
def _growth(f: GraphGrowth) -> str:
    assert f.built is not None and f.reference is not None
    holder, grew = carried_name(f), f.grew
    grew_text = (
        f", and the graph grew from {grew.first_nodes} to {grew.last_nodes} nodes over "
        f"{grew.calls:,} backward calls"
        if grew
        else ""
    )
    return (
        f"Each iteration's graph links to the previous one through `{holder}`, carried at line "
        f"{f.line}{quoted_source(f.built)}: the backward at line {cell_line(f.reference)} walked "
        f"{f.earlier_nodes} nodes from earlier iterations{grew_text}. {growth_fix(f)}"
    )


def _retained(f: RetainedGraph) -> str:
    assert f.reference is not None
    keeper = f" as long as `{f.holder}` is alive" if f.holder else " until the graph is dropped"
    if f.also_held_by:
        keeper += f" (and {name_list((f'`{h}`' for h in f.also_held_by), 'variables')})"
    if f.root_holder:  # the backpropagated root is not what keeps most of them
        keeper += (
            f" (dropping `{f.root_holder}` alone frees only "
            f"{format_bytes(f.root_only_bytes)} of them)"
        )
    kept_text = (
        f"{format_bytes(f.nbytes)} of saved tensors ({len(f.buffer_ids):,} buffers, saved at "
        f"{line_list(f.related_lines)}) that no later backward released; they stay in "
        f"memory{keeper}."
    )
    call_text = f.reference.describe() + quoted_code(f.reference, f.times)
    # What the fix saves, as measured: each backward then frees these saved tensors.
    saves = f"each backward then frees what it walks, these {format_bytes(f.nbytes)} included"
    if f.cause is not None:
        return (
            f"{because(f.cause)}each backward reaches back into it, which is why "
            f"backward(retain_graph=True) at {call_text} seemed needed. It kept {kept_text} "
            f"Once `{carried_name(f.cause)}` is detached, drop retain_graph=True: {saves}."
        )
    return (
        f"backward(retain_graph=True) at {call_text} kept {kept_text} If you "
        f"backpropagate once, drop retain_graph=True ({saves}); for several losses, sum them "
        f"and call backward once."
    )


def _freed_twice(fix: Callable[[F], str]) -> Callable[[F], str]:
    """The words of a backward-through-freed form: what happened, then `fix`'s advice."""

    def words(f: F) -> str:
        assert isinstance(f, FreedTwice) and f.reference is not None
        who = f"`{f.holder}.backward()`" if f.holder else "The backward"
        saved, built = f.saved_lines, f.built_lines
        if saved:
            needs = f"tensors saved at {line_list(saved)}"
        else:  # e.g. a Python number saved by `2 * x`: saved-tensor hooks never see those
            needs = f"the graph built at {line_list(built)}" if built else "a graph"
        releaser = f.releaser
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


# Each form's words, keyed by its fact class (each function takes that class).
_WORDS: dict[type[Fact], Callable[[Any], str]] = {
    KeptChain: _kept_chain,
    KeptContainer: _kept_container,
    GraphGrowth: _growth,
    RetainedGraph: _retained,
    FreedByTwoLosses: _freed_twice(fix_two_losses),
    FreedCarried: _freed_twice(fix_carried),
    FreedKeptContainer: _freed_twice(fix_kept_container),
    FreedByGrad: _freed_twice(fix_by_grad),
    FreedUnshared: _freed_twice(fix_unshared),
    FreedBuiltOnce: _freed_twice(fix_built_once),
    InplaceWrite: write_wording.inplace,
    OptimizerStep: write_wording.optimizer_step,
    LibraryWrite: write_wording.library_write,
    SharedWrite: write_wording.shared_write,
    DataWrite: write_wording.bypass,
    DataUpdate: write_wording.data_update,
    NumpyWrite: write_wording.bypass,
    Leftover: _leftover,
    NoBackward: _no_backward,
    NeverReached: _never_reached,
}
if set(_WORDS) != set(FACT_TYPES):  # a form without words (or words without a form)
    raise RuntimeError(
        f"findings wording out of step with the facts: {set(_WORDS) ^ set(FACT_TYPES)}"
    )


# ----- the live finding, while the block runs -----------------------------------------------
def growth_finding(growth: NodeGrowth, block: str) -> Sentence:
    """The live finding of a running trace whose live nodes grow at every step."""
    per_step = f"{growth.per_step:,.0f}" if growth.per_step >= 10 else f"{growth.per_step:.3g}"
    text = (
        f"So far, live autograd nodes grow by {per_step} per step ({growth.alive:,} alive after "
        f"{growth.steps:,} backward calls)"
    )
    line = built_line(growth)
    held = f"`{growth.holder}` holds them" if growth.holder else "something still holds it"
    if growth.built is not None:
        quote = quoted_source(growth.built)
        text += f": the graph built at line {line}{quote} stays alive after its backward, {held}"
    elif growth.holder is not None:
        text += f": `{growth.holder}` holds the graphs of the last steps"
    text += "." if growth.holder else f". The {block}'s end names the variable that holds it."
    return Sentence(text, line, "finding")
