"""Relaxed deduplication's acceptances under way: a repeat waits for the outcome.

Under relaxed durability, and on a memory store, a ``message_id`` is deduplicated
in memory (``SessionService.claim``): the first caller claims ``(session, id)``,
and a repeat that finds the claim is answered "duplicate" -- accepted already. The
claim is made before the acceptance's outcome is known (the inbox may be full, the
agent disposed, a cold resume may fail), and given back when it fails; a repeat
that found it meanwhile would be told its message was accepted though nothing was.
So one acceptance of an id is under way at a time (:class:`Underway`, one table
per session service, shared by every path that claims: follow-ups, a top-level
agent's ``followup`` and ``send``, reports), and a repeat waits for its outcome:
the claim kept (a duplicate), or given back (the repeat is tried itself).
"""

from __future__ import annotations

import threading

from subagents.actors._kernel import AbortSignal, Latch
from subagents.protocol import MessageId, SessionId

__all__ = ["Underway"]

_Key = tuple[SessionId, MessageId]


class Underway:
    """The ids of acceptances under way here under relaxed deduplication: a repeat
    of one waits for its outcome (its claim of the id is kept, or given back)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held for a dict operation: never across a wait
        self._latches: dict[_Key, Latch] = {}

    def enter(self, key: _Key, signal: AbortSignal) -> Latch:
        """Wait until no acceptance of ``key`` is under way, then mark the caller's:
        the latch it sets (:meth:`leave`) once its outcome is known. Not reentrant:
        a caller under way with ``key`` never enters it again.

        Raises:
            SubagentError: ``CANCELLED`` when ``signal`` aborts first.
        """
        mine = Latch()
        while True:
            with self._lock:
                theirs = self._latches.setdefault(key, mine)
            if theirs is mine:
                return mine
            AbortSignal.any(theirs.signal, signal).wait()
            signal.raise_if_aborted()

    def leave(self, key: _Key, mine: Latch) -> None:
        with self._lock:
            del self._latches[key]
        mine.set()
