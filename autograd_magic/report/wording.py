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
    Bypass,
    DataWrite,
    Fact,
    FreedBuiltOnce,
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
    NeverReached,
    NoBackward,
    NumpyWrite,
    OptimizerStep,
    RetainedGraph,
    SharedWrite,
)
from autograd_magic.analysis.live import NodeGrowth, built_line
from autograd_magic.model.records import Finding
from autograd_magic.model.units import cell_line, format_bytes
from autograd_magic.report import lifetime_words
from autograd_magic.report.model import Sentence
from autograd_magic.report.quotes import (
    CARRIED_VALUE,
    INPLACE_ERROR,
    at_line,
    because,
    called,
    carried_name,
    detached,
    line_list,
    name_list,
    once_detached,
    quoted_code,
    quoted_source,
    saved_by,
    then_fails,
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
        f"{f.earlier_nodes} nodes from earlier iterations{grew_text}. Detach the "
        f"carried value once per iteration, before it is used again: "
        f"`{detached(holder, f.is_tuple)}`" + once_detached(f.retain_graph_used, f.writes_hit_saved)
    )


def _retained(f: RetainedGraph) -> str:
    assert f.reference is not None
    keeper = (
        f" as long as `{f.kept_by}` keeps their graphs (said below)"
        if f.kept_by
        else f" as long as `{f.holder}` is alive"
        if f.holder
        else " until the graph is dropped"
    )
    kept_text = (
        f"{format_bytes(f.nbytes)} of saved tensors ({len(f.buffer_ids):,} buffers, saved at "
        f"{line_list(f.related_lines)}) that no later backward released; they stay in "
        f"memory{keeper}."
    )
    call_text = f.reference.describe() + quoted_code(f.reference, f.times)
    if f.cause is not None:
        return (
            f"{because(f.cause)}each backward reaches back into it, which is why "
            f"backward(retain_graph=True) at {call_text} seemed needed. It kept {kept_text} "
            f"Once `{carried_name(f.cause)}` is detached, drop retain_graph=True."
        )
    return (
        f"backward(retain_graph=True) at {call_text} kept {kept_text} If you "
        f"backpropagate once, drop retain_graph=True; for several losses, sum them and "
        f"call backward once."
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
        releaser, site = f.releaser, f.reference
        if releaser is None:
            earlier = "an earlier backward"
        elif releaser == site:  # each line said once
            earlier = "an earlier run of that same line"
        else:
            line = releaser.line if f.line == site.line else cell_line(releaser)
            earlier = f"the backward at {at_line(line, releaser, quote=False)}{called(releaser)}"
        return (
            f"{who} at {at_line(f.line, site, quote=False)}{called(site)} needs {needs} that "
            f"{earlier} already freed (a backward frees the saved tensors of the graph it "
            f"walks). {fix(f)}"
        )

    return words


def _fix_two_losses(f: FreedByTwoLosses) -> str:
    first, name, releaser = f.first, f.holder, f.releaser
    assert releaser is not None  # two losses: an earlier backward freed the shared part
    total = f"({first} + {name})" if first and name and first != name else "(loss1 + loss2)"
    return (
        f"Passing retain_graph=True at line {cell_line(releaser)} would keep them (and "
        f"their memory) until this call; the usual better fix is one backward over the sum, "
        f"`{total}.backward()`."
    )


def _fix_carried(f: FreedCarried) -> str:
    return (
        f"The shared part is a value carried across iterations (line "
        f"{f.carried_line}): detach it once per iteration "
        f"(`{detached(f.carried, f.is_tuple)}`) rather than passing "
        "retain_graph=True, which would keep every iteration's graph alive."
    )


def _fix_kept_container(f: FreedKeptContainer) -> str:
    container = f.container
    return (
        f"The freed part is reached through `{container}`, which still holds results of "
        f"iterations an earlier backward already used: empty it after each backward "
        f"(`del {container}[:]`), so each loss is built only from the current iteration."
    )


def _fix_unshared(f: FreedUnshared) -> str:
    return (
        "Pass retain_graph=True to the earlier backward, or sum the losses and call backward once."
    )


def _fix_built_once(f: FreedBuiltOnce) -> str:
    widest = f.widest
    value = f"`{widest}`" if widest else "it"
    return (
        f"The shared part was built once ({line_list(f.built_lines)}) and is "
        f"reused by every later backward: if no gradient should flow into it, detach "
        f"{value} (or build it under `torch.no_grad()`); if one should, rebuild it before each "
        "backward."
    )


# ----- writes -------------------------------------------------------------------------------
def _inplace(f: InplaceWrite) -> str:
    assert f.reference is not None
    advice = (
        f"Use the out-of-place form, `{f.fix}`, or `.clone()` the tensor before writing to it."
        if f.fix
        else "Use the out-of-place form of the operation (inplace=False for a layer), or "
        "`.clone()` the tensor before writing to it."
    )
    who = f"`{f.holder}`" + (f" in `{f.scope}`" if f.scope else "")
    inner = called(f.reference)
    return (
        f"In-place `{f.op}` on {who} at {at_line(f.line, f.reference, f.scope)}{inner} changed "
        f"a tensor that {saved_by(f.saved, f.reference.outer_line if inner else None)}; "
        f"{then_fails(f.failed)}. {advice}"
    )


def _optimizer_step(f: OptimizerStep) -> str:
    assert f.reference is not None
    labels = f.labels
    names = name_list(labels, "parameters")
    what = f"`{names}`" if len(labels) == 1 else names
    done = (
        f"the optimizer step at line {f.line}{quoted_source(f.reference)} updated {what} in "
        f"place, tensors that {saved_by(f.saved)}"
    )
    if f.cause is not None:
        return (
            f"{because(f.cause)}the next backward reaches back into that graph: {done}, so it "
            f"fails with {INPLACE_ERROR}. Detaching `{carried_name(f.cause)}` fixes this too."
        )
    then = then_fails(f.failed, ": the graph it walks was built before the step")
    return (
        f"{done[0].upper()}{done[1:]}; {then}. The optimizer updated the weights while a "
        f"retained graph still needs their old values: run every backward before "
        f"optimizer.step(), or redo the forward after it (recompute what you backpropagate)."
    )


def _shared_write(f: SharedWrite) -> str:
    assert f.reference is not None
    sharers = f.sharers
    others = ", ".join(f"`{s}`" + (f" ({how})" if how else "") for s, how in sharers)
    return (
        f"In-place `{f.op}` on `{f.holder}` at {at_line(f.line, f.reference)}"
        f"{called(f.reference)} also changed {others}, which "
        f"{'share' if len(sharers) > 1 else 'shares'} memory with `{f.holder}`. If the old "
        f"values were meant to stay, copy first with `.clone()` (tensors) or `.copy()` (NumPy "
        f"arrays)."
    )


def _bypass(f: Bypass) -> str:
    assert f.reference is not None
    target = f"`{f.holder}`" if f.holder else "a tensor"
    written = f.written
    if isinstance(f, NumpyWrite):
        how = f"NumPy array `{written}` was written (seen at line {f.line})"
    else:
        how = f"`{written}` was written through `.data` at {at_line(f.line, f.reference)}"
    return (
        f"{how}, changing {target} without bumping its version counter, after "
        f"{saved_by(f.saved)}: backward will use the new values without any error, "
        f"so gradients may be silently wrong. Make the change before the forward pass, or "
        f"write under torch.no_grad() without `.data` so autograd's check can see it."
    )


# Each form's words, keyed by its fact class (each function takes that class).
_WORDS: dict[type[Fact], Callable[[Any], str]] = {
    KeptChain: lifetime_words.kept_chain,
    KeptContainer: lifetime_words.kept_container,
    GraphGrowth: _growth,
    RetainedGraph: _retained,
    FreedByTwoLosses: _freed_twice(_fix_two_losses),
    FreedCarried: _freed_twice(_fix_carried),
    FreedKeptContainer: _freed_twice(_fix_kept_container),
    FreedUnshared: _freed_twice(_fix_unshared),
    FreedBuiltOnce: _freed_twice(_fix_built_once),
    InplaceWrite: _inplace,
    OptimizerStep: _optimizer_step,
    SharedWrite: _shared_write,
    DataWrite: _bypass,
    NumpyWrite: _bypass,
    Leftover: lifetime_words.leftover,
    NoBackward: lifetime_words.no_backward,
    NeverReached: lifetime_words.never_reached,
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
