"""Groups of ids joined pair by pair (union-find): tensors sharing storage or a version counter."""

from __future__ import annotations


class DisjointSets:
    """Ids in groups; `join(a, b)` merges their groups under `b`'s root. Members keep the order
    in which they were first seen."""

    def __init__(self) -> None:
        self._parent: dict[int, int] = {}

    def add(self, x: int) -> None:
        """Make `x` a member (its own group unless joined later)."""
        self._parent.setdefault(x, x)

    def find(self, x: int) -> int:
        """The root of `x`'s group (`x` itself if never added)."""
        parent = self._parent
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])  # path halving
            x = parent[x]
        return x

    def join(self, member: int, source: int) -> None:
        """Merge `member`'s group into `source`'s."""
        self.add(source)
        self.add(member)
        self._parent[self.find(member)] = self.find(source)

    def groups(self) -> dict[int, list[int]]:
        """Root -> every member of its group."""
        out: dict[int, list[int]] = {}
        for x in self._parent:
            out.setdefault(self.find(x), []).append(x)
        return out
