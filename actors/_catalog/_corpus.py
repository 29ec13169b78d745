"""The merged corpus a listing reads: live headers over persisted ones, linked.

A :class:`Corpus` holds the headers of the sessions a listing covers -- the live
ones (``activity`` ``running``) winning over their persisted copies -- each
parent's children in ``(created_at, id)`` order, and the undecodable persisted
headers (or rows keyed by no session id) by the parent their indexed column names
(diagnostics of that parent's listing; one whose parent column is no id belongs
to no listing, and only ``subagents tree`` shows it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from subagents.protocol import SessionHeader, SessionId, SubagentError
from subagents.store import StoredKey

from ._rows import Diagnostic

__all__ = ["Corpus", "LiveSessions", "session_key"]


def session_key(value: object) -> SessionId | StoredKey | None:
    """A session id as a broken row names it (its ``session_id``, its parent hint):
    a :class:`SessionId`, the :class:`StoredKey` of a key that is none, or None."""
    if value is None or isinstance(value, StoredKey):
        return value
    if isinstance(value, str):
        try:
            return SessionId(value)
        except SubagentError:
            pass
    return StoredKey.of(value)


class _Live(Protocol):
    projection_mark: Any

    @property
    def header(self) -> SessionHeader: ...


class LiveSessions(Protocol):
    """The live session set as the catalog reads it (``SessionService`` is one)."""

    def live_ids(self) -> list[SessionId]: ...
    def live(self, session_id: SessionId) -> _Live | None: ...
    def read(self, session_id: SessionId, from_seq: int = 0) -> list[Any]: ...


class Corpus:
    """Headers, live ids, children and broken headers of one listing."""

    __slots__ = ("broken", "children", "headers", "identities", "live", "whole_store")

    def __init__(self, *, whole_store: bool) -> None:
        self.whole_store = whole_store  # every stored header was read (not one family)
        self.headers: dict[SessionId, SessionHeader] = {}
        self.live: set[SessionId] = set()
        self.children: dict[SessionId, list[SessionId]] = {}
        self.broken: dict[SessionId, list[Diagnostic]] = {}  # by parent: undecodable headers
        # The cached identity rows of every stored session read, when they were read
        # with the headers (a tree read level by level); None: read them apart.
        self.identities: dict[SessionId, tuple[int, bytes]] | None = None

    def add_persisted(self, items: Iterable[Any], indexed: SessionId | None = None) -> None:
        """Persisted headers, and the undecodable ones by the parent they name.

        ``indexed``: the items are the rows whose parent column names it; a header
        naming another parent (column and header disagree) is a ``corrupt``
        diagnostic of ``indexed``'s listing, not a header of this corpus.
        """
        for item in items:
            if isinstance(item, SessionHeader):
                if indexed is not None and item.parent_session != indexed:
                    detail = (
                        f"session {item.id}: its parent column names {indexed}"
                        f" but its stored header names {item.parent_session}"
                    )
                    diag = Diagnostic(id=item.id, kind="corrupt", detail=detail)
                    self.broken.setdefault(indexed, []).append(diag)
                    continue
                self.headers[item.id] = item
                continue
            parent = session_key((item.hint or {}).get("parent_session"))
            if isinstance(parent, SessionId):
                key = session_key(item.session_id) or StoredKey.of(None)
                diag = Diagnostic(id=key, kind="corrupt", detail=str(item))
                self.broken.setdefault(parent, []).append(diag)

    def add_live_headers(self, headers: Iterable[SessionHeader]) -> None:
        """Live sessions' headers, over their persisted copies."""
        for header in headers:
            self.headers[header.id] = header
            self.live.add(header.id)

    def link(self) -> Corpus:
        """Build each parent's ordered children; returns self."""
        headers: Any = self.headers.values()
        if self.live:  # persistence returns (created_at, id) order; live ones must merge in
            headers = sorted(headers, key=lambda h: (h.created_at, h.id))
        children = self.children
        for header in headers:
            parent = header.parent_session
            if parent is not None:
                siblings = children.get(parent)
                if siblings is None:
                    children[parent] = [header.id]
                else:
                    siblings.append(header.id)
        return self

    def has_children(self, sid: SessionId) -> bool:
        """Whether ``sid`` has a child of origin ``subagent`` (the row's hint)."""
        kids = self.children.get(sid)
        if not kids:  # most nodes of a big tree are leaves: no generator for them
            return False
        headers = self.headers
        return any(headers[c].origin == "subagent" for c in kids)

    def diagnostics_of(self, parent: SessionId) -> list[Diagnostic]:
        """Undecodable headers naming ``parent`` (and not shadowed by a good one)."""
        return [d for d in self.broken.get(parent, ()) if d.id not in self.headers]
