"""What can be said of a trace while it is still recording: graphs of earlier steps that stay
alive, step after step (issue 22, class 7; issue 35, class 9).

The findings (`analysis.findings`) need the block's end: the user's names of what holds a graph
are read then. This pass reads only the records of the latest steps, so its cost does not grow
with the loop, and a live panel can run it at every refresh.

The rule reads what the records say rather than a count's trend. A step is one iteration of the
loop: the backward() calls from one call at a line to the next call at that same line (a GAN's
three calls are one step; see `loop_period`; `autograd.grad` calls are within a step, see
`step_ends`). A correct loop lets go of a step's graph by the end of
the next step, when the variable holding it is assigned again; a loop that keeps its graphs
(`losses.append(loss)`, `total_loss += loss`, a carried state) still holds, at the end of step k,
nodes built in steps k-2, k-3, ... Nodes built at one line in two different steps at least `OLD`
steps old, among the last `SPAN` such steps, are the evidence: it comes 3 steps after the first
kept graph, where a live-node count's trend needed 16 steps and misfires on batches of varying
length. A graph kept once (a first loss, an evaluation output held until the next one) is one
step's graph of its line, not a pile.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from autograd_magic.analysis.findings.lifetime import holder_group, stored_holder
from autograd_magic.model.records import BackwardCall, Site
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import ACCUMULATE_GRAD, cell_line
from autograd_magic.model.watch import MAX_PERIOD, repeat_period

OLD = 2  # steps a kept node must have outlived its own step by (its holder assigned again)
SPAN = 4  # steps at least OLD old that are read: a graph kept long ago ages out
HELD = 2  # of them whose nodes must still be alive
WINDOW = 16  # steps the count fallback reads, once the node records reached their cap
ROOT_SEARCH = 4096  # node records searched back from a backward call for its graph's root


@dataclass(frozen=True)
class NodeGrowth:
    """Nodes built in earlier steps are still alive, about `per_step` more with each step, to
    `alive` live nodes after `steps` backward calls; `built` is where the graph a kept step
    backpropagated through was built, when that graph is still alive."""

    per_step: float
    alive: int
    steps: int
    built: Site | None
    holder: str | None = None  # a container or attribute holding the steps' roots, as now


def node_growth(trace: Trace, window: int = WINDOW) -> NodeGrowth | None:
    """Growth of the graphs kept from step to step, as the records say at the end of the latest
    backward call, or None. Once the node records reached their cap (newer nodes unrecorded)
    and the last steps recorded are too far back, the live-node count rising at each of the
    last `window` step ends says it instead."""
    read = trace.backward_calls[-_CALLS_SEARCHED:]
    ends = step_ends(read)
    calls = ends[-_CALLS_READ:]
    if len(calls) < 2:
        return None
    period = loop_period([c.site for c in calls])
    first = len(read) == len(trace.backward_calls) and len(calls) == len(ends)
    kept = piled(kept_steps(trace, calls, period, first, _recorded_to(trace)))
    if len(kept) < HELD:
        return _counted_growth(trace, window) if trace.dropped_nodes else None
    oldest, newest = max(kept), min(kept)
    per_step = sum(kept.values()) / (oldest - newest + 1)
    root = _alive_root(trace, calls[-1 - newest * period])
    roots = {r for g in kept for c in _step_calls(calls, g, period) for r in c.root_ids}
    return NodeGrowth(
        per_step,
        _live_at(trace, calls[-1].end_seq or 0),
        len(trace.backward_calls),
        root,
        _holder(trace, roots),
    )


# Enough step ends for the oldest step read at the longest period, and the end before it; and
# the latest calls searched for them (a MAML step makes several grad calls per backward).
_CALLS_READ = MAX_PERIOD * (OLD + SPAN) + 1
_CALLS_SEARCHED = 8 * _CALLS_READ


def step_ends(calls: Sequence[BackwardCall]) -> list[BackwardCall]:
    """The completed calls among `calls` that end a step: the `backward()` calls. An
    `autograd.grad` call (an inner MAML step, a gradient penalty) builds or reads graphs within
    a step, whose graphs may rightly live until the step's backward(): a loop made only of
    grad calls gets no live word (its block's end still gets the findings)."""
    return [c for c in calls if c.end_seq is not None and c.kind == "backward"]


def loop_period(sites: Sequence[Site]) -> int:
    """Backward calls per loop iteration: the smallest p for which the call sites of the last
    calls repeat every p calls (1 for a plain loop, 3 for DCGAN's D-real, D-fake, G calls).
    Where no period up to `MAX_PERIOD` fits, `MAX_PERIOD`: a slower word, never a wrong one."""
    return repeat_period(sites, MAX_PERIOD)


def kept_steps(
    trace: Trace,
    calls: Sequence[BackwardCall],
    period: int,
    first: bool = False,
    recorded_to: float = math.inf,
) -> dict[int, dict[Site, int]]:
    """Per step of the last `SPAN` at least `OLD` steps before the latest (by its age in steps:
    2, 3, ...), how many nodes built in it at each line are alive at the end of the latest
    call. `calls` are
    the latest completed backward calls; `first`: they are the block's first, so the oldest
    call's step began with the block. A node is built in call j's step when it is recorded
    after call j-1 ended and by the end of call j; nodes that existed before the block and
    gradient accumulators (a parameter's, alive with any graph using it) are not counted. Once
    the records stopped at their cap (`recorded_to`), the last steps recorded are read."""
    ends = [c.end_seq or 0 for c in calls]
    latest, last = ends[-1], len(ends) - 1
    newest_call = last - OLD * period
    while newest_call >= 0 and ends[newest_call] > recorded_to:
        newest_call -= period
    oldest_call = max(newest_call - SPAN * period + 1, 0 if first else 1)
    if oldest_call > newest_call:
        return {}
    since = ends[oldest_call - 1] if oldest_call > 0 else 0
    nodes = trace.nodes
    at = bisect.bisect_right(nodes, since, key=lambda n: n.born_seq)
    kept: dict[int, dict[Site, int]] = {}
    for index in range(at, len(nodes)):
        node = nodes[index]
        if node.born_seq > ends[newest_call]:
            break
        if node.existed_before or node.name == ACCUMULATE_GRAD:
            continue
        if node.freed_seq is None or node.freed_seq > latest:
            age = (last - bisect.bisect_left(ends, node.born_seq)) // period
            sites = kept.setdefault(age, {})
            sites[node.born_site] = sites.get(node.born_site, 0) + 1
    return kept


def piled(kept: dict[int, dict[Site, int]]) -> dict[int, int]:
    """Of `kept` (per step's age, the nodes alive per line that built them), the nodes of the
    lines that built nodes still alive in `HELD` steps or more, per age: the same line's graphs
    piling up. A first loss kept for the end and an evaluation output held until the next are
    graphs of two lines, one step each."""
    steps_of: dict[Site, int] = {}
    for sites in kept.values():
        for site in sites:
            steps_of[site] = steps_of.get(site, 0) + 1
    pile = {site for site, steps in steps_of.items() if steps >= HELD}
    counts = {age: sum(n for s, n in sites.items() if s in pile) for age, sites in kept.items()}
    return {age: n for age, n in counts.items() if n}


def _step_calls(calls: Sequence[BackwardCall], age: int, period: int) -> Sequence[BackwardCall]:
    """The calls of the step `age` steps before the latest call's."""
    stop = len(calls) - age * period
    return calls[max(0, stop - period) : stop]


def _recorded_to(trace: Trace) -> float:
    """The sequence number up to which every node is recorded (no cap reached: all of them)."""
    if not trace.dropped_nodes:
        return math.inf
    return trace.nodes[-1].born_seq if trace.nodes else 0


def _live_at(trace: Trace, seq: int) -> int:
    """Live nodes as the timeline sampled them at `seq` (the counter now without a sample)."""
    timeline = trace.timeline
    at = bisect.bisect_right(timeline, seq, key=lambda sample: sample.seq)
    return timeline[at - 1].live_nodes if at else trace.live_nodes


def _counted_growth(trace: Trace, window: int) -> NodeGrowth | None:
    """Live nodes counted at the end of each of the last `window` backward calls rose at every
    step: the word once the records stop (a warm-up or a one-off cache grows once, not at every
    step). A correct loop ends each step with as many live nodes as the step before."""
    calls = [c for c in trace.backward_calls[-window - 1 :] if c.end_seq is not None]
    if len(calls) <= window or not trace.timeline:
        return None
    counts = [_live_at(trace, c.end_seq or 0) for c in calls]
    if any(later <= earlier for earlier, later in itertools.pairwise(counts)):
        return None
    first_root = _alive_root(trace, calls[0])
    last_root = _alive_root(trace, calls[-1])
    built = last_root if first_root is not None else None
    per_step = (counts[-1] - counts[0]) / (len(counts) - 1)
    roots = {r for call in calls for r in call.root_ids}
    return NodeGrowth(per_step, counts[-1], len(trace.backward_calls), built, _holder(trace, roots))


def _holder(trace: Trace, roots: set[int]) -> str | None:
    """The container or attribute (`history`, `self.losses`) holding some of `roots`, as the
    last live refresh found them; a plain variable holding the last loss is what any loop does,
    so it is not named."""
    paths = [h.path for h in trace.holders if h.node_id in roots]
    held = stored_holder(paths)
    return None if held is None else holder_group(held)


def _alive_root(trace: Trace, call: BackwardCall) -> Site | None:
    """Where the graph root of backward `call` was built, when that root is alive."""
    roots = call.root_ids
    if not roots:
        return None
    nodes = trace.nodes
    # The root was built before the call began, most often just before.
    stop = bisect.bisect_right(nodes, call.seq, key=lambda n: n.born_seq)
    for at in range(stop - 1, max(-1, stop - 1 - ROOT_SEARCH), -1):
        node = nodes[at]
        if node.id == roots[0]:
            return node.born_site if node.freed_seq is None else None
    return None


def built_line(growth: NodeGrowth) -> int | None:
    """The cell line that builds the graphs that stay alive, when known."""
    return None if growth.built is None else cell_line(growth.built)
