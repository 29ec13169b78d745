"""Where every stored session hangs: roots, and the subtrees no root reaches.

A tree listing starts at a root (a session without a parent). A session whose
chain of parents never reaches a root is in no such listing: its chain ends at a
session the store does not hold (a *missing parent*: deleted, or a damaged key or
parent link), or it loops (a *cycle*: hand-edited parent links). :func:`forest`
finds them all in one header scan, so ``subagents tree`` shows every stored
session somewhere and names the damage instead of losing it.

Undecodable rows (a :class:`~subagents.protocol.CorruptRecordError` in the scan)
hang where their indexed parent column says; a row whose key is no session id is
named by its :class:`~subagents.store.StoredKey`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from subagents.protocol import SessionHeader, SessionId
from subagents.store import StoredKey

from ._corpus import session_key

__all__ = ["Detached", "Forest", "forest"]

Key = SessionId | StoredKey


@dataclass(frozen=True, slots=True)
class Detached:
    """A subtree no root reaches, listed from ``id``.

    ``reason`` is ``"missing-parent"`` (``id`` is not stored; ``members`` name it
    as their parent) or ``"cycle"`` (``members`` are the loop in parent order,
    from ``id``, the member stored first).
    """

    id: Key
    reason: str
    members: tuple[Key, ...]


@dataclass(slots=True)
class Forest:
    """``roots`` (sessions without a parent, broken ones included, in stored
    ``(created_at, id)`` order), ``detached`` subtrees, the decoded ``headers``,
    the ``broken`` rows (the scan's errors) and every stored key's ``parents``
    (from its header, or a broken row's parent column)."""

    roots: list[Key] = field(default_factory=list)
    detached: list[Detached] = field(default_factory=list)
    headers: dict[SessionId, SessionHeader] = field(default_factory=dict)
    broken: dict[Key, Any] = field(default_factory=dict)
    parents: dict[Key, Key | None] = field(default_factory=dict)


def forest(items: Iterable[Any]) -> Forest:
    """The forest of a header scan (``SessionStore.scan_headers()``)."""
    out = Forest()
    parent_of = out.parents
    for item in items:
        if isinstance(item, SessionHeader):
            key: Key | None = item.id
            parent: Key | None = item.parent_session
            out.headers[item.id] = item
        else:
            key = session_key(item.session_id)
            parent = session_key((item.hint or {}).get("parent_session"))
            if key is not None:
                out.broken[key] = item
        if key is None or key in parent_of:
            continue
        parent_of[key] = parent
        if parent is None:
            out.roots.append(key)
    _detach(out, parent_of)
    return out


def _detach(out: Forest, parent_of: dict[Key, Key | None]) -> None:
    """Follow every chain of parents once: to a root, a missing parent, or a loop."""
    rank = {key: n for n, key in enumerate(parent_of)}  # stored order
    missing: dict[Key, list[Key]] = {}
    for key, parent in parent_of.items():
        if parent is not None and parent not in parent_of:
            missing.setdefault(parent, []).append(key)
    detached = [Detached(p, "missing-parent", tuple(m)) for p, m in missing.items()]
    state: dict[Key, bool] = {}  # True: on the chain being followed; False: done
    for start in parent_of:
        path: list[Key] = []
        node: Key | None = start
        while node is not None and node in parent_of and node not in state:
            state[node] = True
            path.append(node)
            node = parent_of[node]
        if node is not None and state.get(node):  # the chain loops back onto itself
            loop = path[path.index(node) :]
            first = min(range(len(loop)), key=lambda i: rank[loop[i]])
            loop = loop[first:] + loop[:first]
            detached.append(Detached(loop[0], "cycle", tuple(loop)))
        for member in path:
            state[member] = False
    detached.sort(key=lambda d: min(rank[m] for m in d.members))
    out.detached = detached
