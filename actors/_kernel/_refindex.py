"""pykka's actor registry with constant-time removal.

``pykka.ActorRegistry`` keeps the ref of every running actor in a list: starting
an actor appends its ref, but stopping one tests the list for it and removes it,
two linear scans. Stopping *n* actors that way costs O(n^2) -- a drain or close
of 10,000 children spends about a sixth of its time in those scans (measured in
bench/README.md), and the share grows with the tree, each scan touching every
other ref in memory.

:func:`install` swaps that list for a :class:`RefIndex`: the same refs in the
same order, behind the operations pykka's registry performs on its list
(``append``, ``remove``, ``in``, iteration, ``[:]``, ``len``), with membership
and removal by hash. Every registry call keeps its meaning -- ``get_all()`` in
start order, ``stop_all()`` newest first -- for every actor in the process, ours
or not. pykka guards the list with its own lock; so is this. The attribute is
listed with the rest of pykka's private surface in :mod:`._pykka`, and the
contract test checks the registry's operations against it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pykka

__all__ = ["RefIndex", "install"]


class RefIndex:
    """An insertion-ordered multiset of actor refs, shaped as pykka's list of them.

    A ref registered twice is listed twice, as in a list, both at its first place
    (pykka never does it; a caller of the public ``ActorRegistry.register``
    might); ``remove`` takes one.
    """

    __slots__ = ("_counts",)

    def __init__(self, refs: Iterable[Any] = ()) -> None:
        self._counts: dict[Any, int] = {}
        for ref in refs:
            self.append(ref)

    def append(self, ref: Any) -> None:
        self._counts[ref] = self._counts.get(ref, 0) + 1

    def remove(self, ref: Any) -> None:
        """Remove one occurrence of ``ref``; ``ValueError`` when absent, as a list's."""
        count = self._counts.get(ref)
        if count is None:
            raise ValueError(f"{ref!r} is not registered")
        if count == 1:
            del self._counts[ref]
        else:
            self._counts[ref] = count - 1

    def __contains__(self, ref: object) -> bool:
        return ref in self._counts

    def _listed(self) -> list[Any]:
        counts = self._counts
        if len(counts) == sum(counts.values()):  # the usual case: each ref once
            return list(counts)
        return [ref for ref, n in counts.items() for _ in range(n)]

    def __iter__(self) -> Iterator[Any]:
        # A copy: pykka iterates under its lock, but a caller might not.
        return iter(self._listed())

    def __getitem__(self, index: Any) -> Any:
        return self._listed()[index]

    def __len__(self) -> int:
        return sum(self._counts.values())

    def __repr__(self) -> str:
        return f"RefIndex({self._listed()!r})"


def install() -> None:
    """Make ``pykka.ActorRegistry`` keep its refs in a :class:`RefIndex` (once;
    the refs registered so far are kept, in order)."""
    registry: Any = pykka.ActorRegistry  # its list is typed as a list
    with registry._actor_refs_lock:
        if not isinstance(registry._actor_refs, RefIndex):
            registry._actor_refs = RefIndex(registry._actor_refs)
