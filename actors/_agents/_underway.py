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
from typing import Any

from subagents.actors._kernel import AbortSignal, Latch
from subagents.protocol import MessageId, SessionId

__all__ = ["Underway"]

_Key = tuple[SessionId, MessageId]
#: No acceptance of the key is under way (``None``: one is, and nobody waits on it).
_FREE: Any = object()


class Underway:
    """The ids of acceptances under way here under relaxed deduplication: a repeat
    of one waits for its outcome (its claim of the id is kept, or given back)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # held for a dict operation: never across a wait
        # The latch a repeat waits on, made by the first repeat: an acceptance
        # nobody repeats meanwhile -- nearly every one -- makes none (a hot path).
        self._latches: dict[_Key, Latch | None] = {}

    def enter(self, key: _Key, signal: AbortSignal) -> None:
        """Wait until no acceptance of ``key`` is under way, then mark the caller's,
        until it :meth:`leave` s it once its outcome is known. Not reentrant: a
        caller under way with ``key`` never enters it again.

        Raises:
            SubagentError: ``CANCELLED`` when ``signal`` aborts first.
        """
        latches = self._latches
        while True:
            with self._lock:
                theirs = latches.get(key, _FREE)
                if theirs is _FREE:
                    latches[key] = None
                    return
                if theirs is None:
                    theirs = latches[key] = Latch()
            AbortSignal.any(theirs.signal, signal).wait()
            signal.raise_if_aborted()

    def leave(self, key: _Key) -> None:
        """The caller's acceptance of ``key`` has its outcome: a repeat may go on."""
        with self._lock:
            theirs = self._latches.pop(key)
        if theirs is not None:
            theirs.set()
