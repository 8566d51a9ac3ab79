"""The advice that closes a finding about graphs reaching across backward calls: one function
per backward-through-freed form and the carried-value advice of graph-growth, each fitting what
the code means (a rollout read by every epoch is collected without graphs, not emptied; fast
weights restart from the parameters, not detached; a penalty's `torch.autograd.grad` takes
create_graph=True). `autograd_magic.report.wording` puts them after what happened.
"""

from __future__ import annotations

from autograd_magic.analysis.findings.facts import (
    FreedBuiltOnce,
    FreedByGrad,
    FreedByTwoLosses,
    FreedCarried,
    FreedKeptContainer,
    FreedUnshared,
    GraphGrowth,
)
from autograd_magic.model.units import cell_line
from autograd_magic.report.quotes import carried_name, detached, line_list, once_detached

# How a user rebinds fast weights to the parameters; the trace does not know their name.
_RESTART = "`{0} = list(model.parameters())` (or your own list of parameters)"


def growth_fix(f: GraphGrowth) -> str:
    """The carried value's fix: detach it once per iteration, or for MAML's fast weights,
    start each task from the parameters (detaching would cut the meta-gradient)."""
    holder = carried_name(f)
    if f.fast_weights:
        return (
            f"These are fast weights made from gradients (create_graph=True) and carried into "
            f"the next task: start each task from the parameters, "
            f"{_RESTART.format(holder)} before its inner steps. Detaching them instead would cut "
            f"the meta-gradient through the inner steps."
        )
    return (
        f"Detach the carried value once per iteration, before it is used again: "
        f"`{detached(holder, f.is_tuple)}`" + once_detached(f.retain_graph_used, f.writes_hit_saved)
    )


def fix_two_losses(f: FreedByTwoLosses) -> str:
    first, name, releaser = f.first, f.holder, f.releaser
    assert releaser is not None  # two losses: an earlier backward freed the shared part
    total = f"({first} + {name})" if first and name and first != name else "(loss1 + loss2)"
    return (
        f"Passing retain_graph=True at line {cell_line(releaser)} would keep them (and "
        f"their memory) until this call; the usual better fix is one backward over the sum, "
        f"`{total}.backward()`."
    )


def fix_carried(f: FreedCarried) -> str:
    if f.fast_weights:
        return (
            f"The shared part is `{f.carried}`, fast weights carried from one task into the "
            f"next (line {f.carried_line}): start each task from the parameters, "
            f"{_RESTART.format(f.carried)}, rather than detaching them, which would cut the "
            "meta-gradient, or passing retain_graph=True, which would keep every task's graph."
        )
    return (
        f"The shared part is a value carried across iterations (line "
        f"{f.carried_line}): detach it once per iteration "
        f"(`{detached(f.carried, f.is_tuple)}`) rather than passing "
        "retain_graph=True, which would keep every iteration's graph alive."
    )


def fix_kept_container(f: FreedKeptContainer) -> str:
    container = f.container
    if not f.refilled:  # collected once, read by every epoch's loss (a PPO rollout)
        return (
            f"The freed part is reached through `{container}`, which holds values collected "
            f"once with their graphs and read again by each later loss: collect them under "
            f"`torch.no_grad()`, or store `.detach()` of each, and let the update recompute "
            f"with gradients what it trains (the log-probabilities of the stored actions)."
        )
    return (
        f"The freed part is reached through `{container}`, which still holds results of "
        f"iterations an earlier backward already used: empty it after each backward "
        f"(`del {container}[:]`), so each loss is built only from the current iteration."
    )


def fix_by_grad(f: FreedByGrad) -> str:
    return (
        "`torch.autograd.grad` without create_graph=True frees the graph it walks and returns "
        "gradients without a graph, so a penalty made from them trains nothing. Pass "
        "`create_graph=True` to it, as gradient penalties (R1, WGAN-GP) do: the graph is kept "
        "for this backward and the penalty's gradient reaches the model. If you only read "
        "those gradients, pass retain_graph=True instead."
    )


def fix_unshared(f: FreedUnshared) -> str:
    return (
        "Pass retain_graph=True to the earlier backward, or sum the losses and call backward once."
    )


def fix_built_once(f: FreedBuiltOnce) -> str:
    widest = f.widest
    value = f"`{widest}`" if widest else "it"
    if f.trains:  # detaching would silently stop the parameters under it from training
        return (
            f"The shared part was built once ({line_list(f.built_lines)}) from parameters the "
            f"backward trains, and every later backward reuses it: compute {value} where it is "
            f"used, inside `forward` (or before each backward), so each backward walks a graph "
            f"of its own and the parameters keep training through it."
        )
    return (
        f"The shared part was built once ({line_list(f.built_lines)}) and is "
        f"reused by every later backward: if no gradient should flow into it, detach "
        f"{value} (or build it under `torch.no_grad()`); if one should, rebuild it before each "
        "backward."
    )
