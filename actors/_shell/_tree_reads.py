"""What ``subagents tree`` reads of each session besides its listing, a window at a time.

A frame of ``tree`` (``--json``, a ``--watch`` frame, a ``serve`` frame) reads
the store in a number of statements that follows the number of windows of
sessions shown, never the number of sessions: for each window its logs, its
inboxes and its leases in a few statements (a chunk of sessions each), with one
reading of the store's clock. A log the listing already read to find a
session's identity (a session whose identity row is not cached: on a read-only
store, every listing again) is folded there once (:meth:`TreeReads.folded`) and
not read again. Where a read of many fails for a damaged database, each session
is read alone instead (by the caller), so that the damage stays with its own
sessions.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from subagents.actors._catalog import SessionState, session_state
from subagents.protocol import SessionId, SubagentError
from subagents.store import SessionStore

from ._down import raise_if_down
from ._held import held_now, lease_held

__all__ = ["TreeReads", "damaged_entry", "gap_of", "stored_state"]


def gap_of(records: list[Any]) -> int | None:
    """The first seq missing from a log read whole (None: no row is gone)."""
    return next((i for i, r in enumerate(records) if r.seq != i), None)


class TreeReads:
    """The read-ahead of the trees being shown (see the module docstring)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        #: States the listing folded, with the first seq its log misses, by id.
        self.folds: dict[SessionId, tuple[dict[str, Any], int | None]] = {}
        self.logs: dict[SessionId, Any] = {}
        self.inboxes: dict[SessionId, list[Any]] = {}
        self.damaged: dict[SessionId, list[int]] = {}
        #: The window's sessions a live process holds (None: the store cannot say).
        self.held: set[SessionId] | None = None

    def folded(self, sid: SessionId, records: list[Any], states: dict[str, Any]) -> None:
        """Keep what the listing folded of ``sid``'s log (the catalog's ``folded``)."""
        self.folds[sid] = (states, gap_of(records))

    def window(self, sids: list[SessionId]) -> None:
        """Read the logs not folded yet, the inboxes and the leases of ``sids`` (a
        window of the trees shown) in a few statements."""
        self.logs, self.inboxes, self.damaged, self.held = {}, {}, {}, None
        store = self.store
        try:
            self.logs = store.read_many([s for s in sids if s not in self.folds])
            self.inboxes = store.pending_many(sids, damaged=self.damaged)
        except SubagentError as exc:
            raise_if_down(exc)  # a store down fails the command, not each session
        # Live in a process, not in this one (R-LIST-7 as a reader sees it).
        self.held = held_now(store, sids)

    def holds(self, sid: object) -> bool:
        """Whether a live process holds ``sid`` (True where the store cannot say)."""
        if not isinstance(sid, SessionId):
            return True
        if self.held is None:  # no lease read for the window: asked alone
            return lease_held(self.store, sid)
        return sid in self.held


def stored_state(
    store: Any,
    sid: Any,
    raw: Any,
    pending: list[Any],
    damaged: list[int],
    created_at: dt.datetime | None,
    held: bool | None = None,
) -> SessionState:
    """A session's state from its folded log (``raw``) and its durable inbox, as
    ``tree`` and ``show`` print it: a damaged entry counts (accepted, if
    unreadable); a quiet report waits for the next turn and starts none (not
    ``waiting``); a turn the log shows open runs only while a live process holds
    the session (``held``; None: asked of the store, :func:`lease_held`)."""
    quiet = sum(getattr(e.event, "delivery", None) == "quiet" for e in pending)
    opened = getattr(raw, "open", False)
    if opened and held is None:
        held = lease_held(store, sid)
    inbox = len(pending) + len(damaged) - quiet
    return session_state(raw, inbox=inbox, created_at=created_at, held=not opened or bool(held))


def damaged_entry(n: int) -> str:
    """The diagnostic of an inbox entry that does not decode."""
    return f"inbox entry {n} does not decode"
