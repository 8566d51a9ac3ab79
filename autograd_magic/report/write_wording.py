"""The words of the write findings (inplace-on-saved, shared-write, data-bypass), kept apart
from `autograd_magic.report.wording`, which puts every form's words in one table."""

from __future__ import annotations

from autograd_magic.analysis.findings.facts import (
    Bypass,
    DataUpdate,
    InplaceWrite,
    LibraryWrite,
    NumpyWrite,
    OptimizerStep,
    SharedWrite,
)
from autograd_magic.report.quotes import (
    INPLACE_ERROR,
    at_line,
    because,
    called,
    carried_name,
    name_list,
    quoted_source,
    saved_by,
    then_fails,
)


def inplace(f: InplaceWrite) -> str:
    assert f.reference is not None
    advice = (
        f"Use the out-of-place form, `{f.fix}`, or `.clone()` the tensor before writing to it."
        if f.fix
        else "Use the out-of-place form of the operation (inplace=False for a layer), or "
        "`.clone()` the tensor before writing to it."
    )
    target = f"`{f.holder}`" if f.holder else "an unnamed tensor"
    who = target + (f" in `{f.scope}`" if f.scope else "")
    inner = called(f.reference)
    return (
        f"In-place `{f.op}` on {who} at {at_line(f.line, f.reference, f.scope)}{inner} changed "
        f"a tensor that {saved_by(f.saved, f.reference.outer_line if inner else None)}; "
        f"{then_fails(f.failed)}. {advice}"
    )


def optimizer_step(f: OptimizerStep) -> str:
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


def library_write(f: LibraryWrite) -> str:
    assert f.reference is not None
    weight = f"`{f.holder}`" if f.holder else "its weight"
    who = f"`{f.module}`" if f.module else f"`F.{f.call}`"
    kind = f" ({f.module_type})" if f.module and f.module_type else ""
    if f.call == "embedding":
        inside = "with max_norm set, `F.embedding` renormalizes the rows it looks up"
        clone = f"`{f.holder}.clone()`" if f.holder else "a `.clone()` of the weight"
        advice = (
            f"Finish what uses {weight} for gradients (its backward) before calling {who} "
            f"again, or call {who} before that use; where the weight itself is used, use "
            f"{clone} there, as PyTorch's docs for max_norm ask."
        )
    else:
        inside = f"`F.{f.call}` writes to it inside its body"
        advice = (
            f"Make this call before the line that saved {weight}, or use a `.clone()` of it "
            f"on that line."
        )
    return (
        f"Calling {who}{kind} at {at_line(f.line, f.reference)} changed {weight} in place "
        f"({inside}) after {saved_by(f.saved)}; {then_fails(f.failed)}. {advice}"
    )


def shared_write(f: SharedWrite) -> str:
    assert f.reference is not None
    said = [f"`{s}`" + (f" ({how})" if how else "") for s, how in f.sharers]
    said += [f"a tensor made by `{how}` at line {line}" for how, line in f.unnamed]
    many = len(said) > 1
    return (
        f"In-place `{f.op}` on `{f.holder}` at {at_line(f.line, f.reference)}"
        f"{called(f.reference)} also changed {', '.join(said)}, which "
        f"{'share' if many else 'shares'} memory with `{f.holder}`. If the old "
        f"values were meant to stay, copy first with `.clone()` (tensors) or `.copy()` (NumPy "
        f"arrays)."
    )


def bypass(f: Bypass) -> str:
    assert f.reference is not None
    target = f"`{f.holder}`" if f.holder else "a tensor"
    written = f.written
    if isinstance(f, NumpyWrite):
        array = f"NumPy array `{written}`" if written else "A NumPy array"
        how = f"{array} was written (seen at line {f.line})"
    else:
        alias = f"`{written}`" if written else "A tensor"
        how = f"{alias} was written through `.data` at {at_line(f.line, f.reference)}"
    return (
        f"{how}, changing {target} without bumping its version counter, after "
        f"{saved_by(f.saved)}: backward will use the new values without any error, "
        f"so gradients may be silently wrong. Make the change before the forward pass, or "
        f"write under torch.no_grad() without `.data` so autograd's check can see it."
    )


def data_update(f: DataUpdate) -> str:
    assert f.reference is not None
    labels = f.labels
    count = len(labels)
    shown = ", ".join(f"`{n}`" for n in labels[:2]) + (", ..." if count > 2 else "")
    if count > 1:
        what = f"{count:,} parameters of `{f.holder}` ({shown})"
    else:
        what = f"`{labels[0]}`" if labels else "parameters"
    done = (
        f"the manual update at line {f.line}{quoted_source(f.reference)} changed {what} through "
        f"`.data`, after {saved_by(f.saved)}; autograd's version check cannot see such a write"
    )
    plain = f"`{f.fix}`" if f.fix else "the same line without `.data`"
    written = f"write the update under `with torch.no_grad():` as {plain}"
    if f.cause is not None:
        return (
            f"{because(f.cause)}the next backward reaches back into that graph: {done}, so that "
            f"backward silently uses the new values. Detaching `{carried_name(f.cause)}` fixes "
            f"this too; then {written}, so any later write to a saved tensor raises an error "
            f"instead of giving wrong gradients."
        )
    return (
        f"{done[0].upper()}{done[1:]}, and a backward had already walked the graph and kept it "
        f"(retain_graph=True): a later backward through it uses the new values without any "
        f"error, so gradients may be silently wrong. Update the parameters after the last "
        f"backward through that graph (or sum the losses and call backward once), and "
        f"{written}, so autograd's check sees it."
    )
