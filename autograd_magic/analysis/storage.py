"""Storage groups: tensors and arrays sharing one memory block, built from recorded alias links."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from autograd_magic.model.disjoint_sets import DisjointSets
from autograd_magic.model.records import AliasLink, StorageGroup
from autograd_magic.model.units import object_label


def storage_groups(
    links: Sequence[AliasLink], labels: Mapping[int, str], alive_at_end: Collection[int] | None
) -> list[StorageGroup]:
    """Connected components of shared-memory links; copies listed beside their source's group.
    `alive_at_end` (alive at the end, or at the last refresh; None: unknown) hides unnamed
    temporaries that died."""
    sets = DisjointSets()

    def label(uid: int) -> str:
        return object_label(labels, uid)

    def worth_showing(uid: int) -> bool:
        # Named members always; unnamed ones (`unsqueeze#3`) only if still alive at the end:
        # the temporaries of `data[i].unsqueeze(0)` would bury the groups users made.
        return alive_at_end is None or uid in alive_at_end or "#" not in label(uid)

    how: dict[int, str] = {}
    for link in links:
        if link.shares:
            sets.join(link.member, link.source)
            how.setdefault(link.member, link.how)
    copies: dict[int, dict[str, str]] = {}
    for link in links:
        if not link.shares:
            sets.add(link.source)
            root = sets.find(link.source)
            if worth_showing(link.member):
                copies.setdefault(root, {})[label(link.member)] = label(link.source)
    members = sets.groups()
    groups = []
    for root, all_uids in sorted(members.items()):
        uids = [u for u in all_uids if worth_showing(u)]
        if len(uids) < 2 and root not in copies:
            continue
        uids.sort()
        names = tuple(label(u) for u in uids)
        group_how = {label(u): how.get(u, "original") for u in uids}
        groups.append(StorageGroup(names, group_how, copies.get(root, {})))
    return groups
