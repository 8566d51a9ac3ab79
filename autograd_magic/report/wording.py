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
)
from autograd_magic.analysis.live import NodeGrowth, built_line
from autograd_magic.model.records import Finding
from autograd_magic.model.units import cell_line, format_bytes
from autograd_magic.report import lifetime_words, write_wording
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
    called,
    carried_name,
    line_list,
    quoted_code,
    quoted_source,
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
        f"{f.earlier_nodes} nodes from earlier iterations{grew_text}. {growth_fix(f)}"
    )


def _retained(f: RetainedGraph) -> str:
    assert f.reference is not None
    holders = " or ".join(f"`{h}`" for h in dict.fromkeys((f.holder, *f.also_held_by)))
    keeper = (
        f" as long as `{f.kept_by}` keeps their graphs (said below)"
        if f.kept_by
        else f" as long as {holders} is alive"
        if f.holder
        else " until the graph is dropped"
    )
    if f.root_holder and not f.kept_by:  # the backpropagated root is not what keeps most
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


# Each form's words, keyed by its fact class (each function takes that class).
_WORDS: dict[type[Fact], Callable[[Any], str]] = {
    KeptChain: lifetime_words.kept_chain,
    KeptContainer: lifetime_words.kept_container,
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
