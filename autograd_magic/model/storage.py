"""Storage groups: tensors and arrays sharing one memory block, built from recorded alias links."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autograd_magic.model.records import StorageGroup

if TYPE_CHECKING:
    from autograd_magic.model.trace import Trace


def storage_groups(trace: Trace) -> list[StorageGroup]:
    """Connected components of shared-memory links; copies listed beside their source's group."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    how: dict[int, str] = {}
    for link in trace.links:
        if link.shares:
            parent.setdefault(link.source, link.source)
            parent.setdefault(link.member, link.member)
            parent[find(link.member)] = find(link.source)
            how.setdefault(link.member, link.how)
    copies: dict[int, dict[str, str]] = {}
    for link in trace.links:
        if not link.shares:
            parent.setdefault(link.source, link.source)
            root = find(link.source)
            if _worth_showing(trace, link.member):
                copies.setdefault(root, {})[trace.label(link.member)] = trace.label(link.source)
    members: dict[int, list[int]] = {}
    for uid in parent:
        members.setdefault(find(uid), []).append(uid)
    groups = []
    for root, all_uids in sorted(members.items()):
        uids = [u for u in all_uids if _worth_showing(trace, u)]
        if len(uids) < 2 and root not in copies:
            continue
        uids.sort()
        labels = tuple(trace.label(u) for u in uids)
        group_how = {trace.label(u): how.get(u, "original") for u in uids}
        groups.append(StorageGroup(labels, group_how, copies.get(root, {})))
    return groups


def _worth_showing(trace: Trace, uid: int) -> bool:
    """Named members always; unnamed ones (`unsqueeze#3`) only if still alive at the end: the
    temporaries of an expression like `data[i].unsqueeze(0)` would bury the groups users made."""
    alive = trace.alive_at_end
    return alive is None or uid in alive or "#" not in trace.label(uid)
