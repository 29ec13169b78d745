"""The sessions this runtime rang its own mail pickup for, not yet looked at.

A message committed for a session live here but taken by nobody -- one of this
process's sends that met the session's activation in progress, a report to a
parent whose replay was not queued yet, a release that found messages waiting
-- runs once the pickup takes it into the agent's loop. Until then no agent is
busy with it, and ``Runtime.wait_idle`` returned before it ran although the
call that accepted it had returned. :class:`Rung` keeps each ring's number
until a pickup of that session began after it and handed what it found to the
agent's loop (which counts it in flight); ``wait_idle`` waits for it to empty.

A ring the doorbell lost is answered by the next sweep, which looks at every
session with messages nobody took.
"""

from __future__ import annotations

import itertools
import threading

from subagents.protocol import SessionId

__all__ = ["Rung"]


class Rung:
    """Rings of this runtime's own pickup not yet answered (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # (never held across a yield)
        self._marks: dict[SessionId, int] = {}
        self._count = itertools.count(1)

    def ring(self, sid: SessionId) -> None:
        """``sid`` was rung: its pickup is owed."""
        with self._lock:
            self._marks[sid] = next(self._count)

    def mark(self, sid: SessionId) -> int | None:
        """The latest ring of ``sid`` (None: none owed), read as a pickup begins."""
        return self._marks.get(sid)

    def answered(self, sid: SessionId, mark: int | None) -> None:
        """A pickup that began at ``mark`` is done: the rings up to it are answered
        (a ring made meanwhile stays owed)."""
        if mark is None:
            return
        with self._lock:
            if self._marks.get(sid) == mark:
                del self._marks[sid]

    def owed(self) -> dict[SessionId, int]:
        """Every ring owed now, with its mark (a sweep answers them all)."""
        with self._lock:
            return dict(self._marks)

    def clear(self) -> None:
        """Nothing owed any more: the pickup stopped (its runtime closed)."""
        with self._lock:
            self._marks.clear()

    def __bool__(self) -> bool:
        """Whether any ring is owed."""
        return bool(self._marks)
