"""Stable ids for the tensors and arrays the recorder has seen, held by weak reference only."""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any


class ObjectRegistry:
    """Gives each tracked tensor/array an id and an op label (`exp#3`) without keeping it alive."""

    def __init__(self) -> None:
        self._by_address: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._by_uid: dict[int, weakref.ref[Any]] = {}
        self._counts: Counter[str] = Counter()
        self.op_labels: dict[int, str] = {}
        self.kinds: dict[int, str] = {}
        # Ids of objects that died since the owner last looked (`take_dead`): per-object state
        # elsewhere is dropped with them, so a million short-lived views cost no lasting memory.
        self._dead: list[int] = []
        self._next = 1

    def uid(self, obj: Any, hint: str) -> int:
        """The id of `obj`, registering it (with label `hint#k`) the first time it is seen."""
        entry = self._by_address.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]
        uid = self._next
        self._next += 1
        self._counts[hint] += 1
        self.op_labels[uid] = f"{hint}#{self._counts[hint]}"
        self.kinds[uid] = "ndarray" if type(obj).__name__ == "ndarray" else "tensor"
        try:
            # A weak ref, so the registry never extends a tensor's life; the callback drops the
            # entry before the address can be reused by a new object.
            ref = weakref.ref(obj, self._forgetter(id(obj), uid))
        except TypeError:
            return uid
        self._by_address[id(obj)] = (ref, uid)
        self._by_uid[uid] = ref
        return uid

    def _forgetter(self, address: int, uid: int) -> Any:
        # The callback holds the tables, never the registry: no cycle through the weak refs.
        table, by_uid, labels, kinds, dead = (
            self._by_address,
            self._by_uid,
            self.op_labels,
            self.kinds,
            self._dead,
        )

        def forget(_ref: Any) -> None:
            by_uid.pop(uid, None)
            # A dead object's label lives on in the trace (`Trace.labels`, capped) if at all.
            labels.pop(uid, None)
            kinds.pop(uid, None)
            dead.append(uid)
            entry = table.get(address)
            if entry is not None and entry[1] == uid:
                del table[address]

        return forget

    def dead_count(self) -> int:
        """How many objects died since the last `take_dead`."""
        return len(self._dead)

    def take_dead(self) -> list[int]:
        """The ids of objects that died since the last call."""
        dead = self._dead[:]
        del self._dead[:]
        return dead

    def forget(self, obj: Any) -> None:
        """Drop the weak reference to `obj` (its id and label stay): `torch.utils.swap_tensors`
        refuses tensors that have any."""
        entry = self._by_address.get(id(obj))
        if entry is not None and entry[0]() is obj:
            del self._by_address[id(obj)]
            self._by_uid.pop(entry[1], None)

    def alive(self) -> dict[int, int]:
        """Address -> uid of the registered objects that are still alive."""
        return {addr: uid for addr, (ref, uid) in self._by_address.items() if ref() is not None}

    def get(self, uid: int) -> Any | None:
        """The live object for `uid`, or None once it has died."""
        ref = self._by_uid.get(uid)
        return None if ref is None else ref()
