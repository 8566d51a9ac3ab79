"""Stable ids for the tensors and arrays the recorder has seen, held by weak reference only."""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

from autograd_magic.recorder.deferred import finalizer, hold


class _Entry(weakref.ref):
    """A weak reference that carries its object's address and id, for the death callback."""

    __slots__ = ("address", "uid")
    address: int
    uid: int


class ObjectRegistry:
    """Gives each tracked tensor/array an id and an op label (`exp#3`) without keeping it alive."""

    def __init__(self) -> None:
        self._by_address: dict[int, _Entry] = {}
        self._by_uid: dict[int, _Entry] = {}
        self._counts: Counter[str] = Counter()
        self.op_labels: dict[int, str] = {}
        self.kinds: dict[int, str] = {}
        # Ids of objects that died since the owner last looked (`take_dead`): per-object state
        # elsewhere is dropped with them, so a million short-lived views cost no lasting memory.
        self._dead: list[int] = []
        self._next = 1
        self._forget = _forgetter(
            self._by_address, self._by_uid, self.op_labels, self.kinds, self._dead
        )

    def uid(self, obj: Any, hint: str) -> int:
        """The id of `obj`, registering it (with label `hint#k`) the first time it is seen."""
        entry = self._by_address.get(id(obj))
        if entry is not None and entry() is obj:
            return entry.uid
        uid = self._next
        self._next += 1
        count = self._counts[hint] + 1
        self._counts[hint] = count
        self.op_labels[uid] = f"{hint}#{count}"
        self.kinds[uid] = "ndarray" if type(obj).__name__ == "ndarray" else "tensor"
        try:
            # A weak ref, so the registry never extends a tensor's life; the callback drops the
            # entry before the address can be reused by a new object.
            ref = _Entry(obj, self._forget)
        except TypeError:
            return uid
        ref.address, ref.uid = id(obj), uid
        self._by_address[id(obj)] = ref
        self._by_uid[uid] = ref
        return uid

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
        if entry is not None and entry() is obj:
            del self._by_address[id(obj)]
            self._by_uid.pop(entry.uid, None)

    def release(self) -> None:
        """Drop every weak reference (the block has ended; ids and labels stay): a tensor that
        has one cannot be swapped (`torch.utils.swap_tensors`)."""
        self._by_address.clear()
        self._by_uid.clear()

    def alive(self) -> dict[int, int]:
        """Address -> uid of the registered objects that are still alive."""
        return {addr: ref.uid for addr, ref in self._by_address.items() if ref() is not None}

    def get(self, uid: int) -> Any | None:
        """The live object for `uid`, or None once it has died."""
        ref = self._by_uid.get(uid)
        return None if ref is None else ref()


def _forgetter(
    table: dict[int, _Entry],
    by_uid: dict[int, _Entry],
    labels: dict[int, str],
    kinds: dict[int, str],
    dead: list[int],
) -> Any:
    # One callback per registry, holding its tables and never the registry: no cycle through
    # the weak refs (users may run with gc disabled).
    @finalizer
    def forget(ref: _Entry) -> None:
        uid = ref.uid  # before the guard: see deferred.finalizer
        try:
            by_uid.pop(uid, None)
            # A dead object's label lives on in the trace (`Trace.labels`, capped) if at all.
            labels.pop(uid, None)
            kinds.pop(uid, None)
            dead.append(uid)
            if table.get(ref.address) is ref:
                del table[ref.address]
        except Exception:
            pass
        except BaseException as error:
            hold(error)

    return forget
