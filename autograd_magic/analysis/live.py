"""What can be said of a trace while it is still recording: the live-node count growing step
after step (issue 22, class 7).

The findings (`analysis.findings`) need the block's end: the user's names of what holds a graph
are read then. This pass reads only the latest backward calls and timeline samples, so its cost
does not grow with the loop, and a live panel can run it at every refresh.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from autograd_magic.analysis.findings.lifetime import holder_group, stored_holder
from autograd_magic.model.records import Site
from autograd_magic.model.trace import Trace
from autograd_magic.model.units import cell_line

WINDOW = 16  # steps (backward calls) the growth is measured over
ROOT_SEARCH = 4096  # newest node records searched for a step's graph root


@dataclass(frozen=True)
class NodeGrowth:
    """Live nodes counted at the end of each of the last `WINDOW` backward calls rose at every
    step: by `per_step` on average, to `alive` after `steps` calls; `built` is where the graph
    each step backpropagates through was built, when that graph is still alive."""

    per_step: float
    alive: int
    steps: int
    built: Site | None
    holder: str | None = None  # a container or attribute holding the steps' roots, as now


def node_growth(trace: Trace, window: int = WINDOW) -> NodeGrowth | None:
    """The steady growth of live nodes from step to step, or None. A correct loop ends each
    step with as many live nodes as the step before (the last loss may hold its graph until the
    next one replaces it); a loop that keeps its graphs ends each step with more."""
    ends = [c.end_seq for c in trace.backward_calls[-window - 1 :] if c.end_seq is not None]
    if len(ends) <= window or not trace.timeline:
        return None
    timeline = trace.timeline
    counts = []
    for end in ends:
        at = bisect.bisect_right(timeline, end, key=lambda sample: sample.seq)
        if at == 0:
            return None
        counts.append(timeline[at - 1].live_nodes)
    # Every step adds: a warm-up or a one-off cache grows once, not at every step.
    if any(later <= earlier for earlier, later in itertools.pairwise(counts)):
        return None
    first_root = _alive_root(trace, -window - 1)
    last_root = _alive_root(trace, -1)
    built = last_root if first_root is not None and last_root is not None else None
    per_step = (counts[-1] - counts[0]) / (len(counts) - 1)
    holder = _holder(trace, window)
    return NodeGrowth(per_step, counts[-1], len(trace.backward_calls), built, holder)


def _holder(trace: Trace, window: int) -> str | None:
    """The container or attribute (`history`, `self.losses`) holding the roots of the last
    steps' backward calls, as the last live refresh found them; a plain variable holding the
    last loss is what any loop does, so it is not named."""
    roots = {r for call in trace.backward_calls[-window - 1 :] for r in call.root_ids}
    paths = [h.path for h in trace.holders if h.node_id in roots]
    held = stored_holder(paths)
    return None if held is None else holder_group(held)


def _alive_root(trace: Trace, index: int) -> Site | None:
    """Where the graph root of backward call `index` was built, when that root is alive."""
    roots = trace.backward_calls[index].root_ids
    if not roots:
        return None
    for node in reversed(trace.nodes[-ROOT_SEARCH:]):
        if node.id == roots[0]:
            return node.born_site if node.freed_seq is None else None
    return None


def built_line(growth: NodeGrowth) -> int | None:
    """The cell line that builds the graphs that stay alive, when known."""
    return None if growth.built is None else cell_line(growth.built)
