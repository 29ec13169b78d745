"""Persistence failures, kept where they can be seen: ``runtime.sessions.statistics()``.

A session whose write failed (disk full, an I/O error, a store that refused the
row) gets no later writes -- its log must have no holes -- and its agent stops:
its next ``followup`` raises ``PERSISTENCE_UNAVAILABLE`` naming the failure, and
the rest of the runtime goes on. The failure stays listed until the session is
activated again (``Runtime.resume`` or a parent's follow-up), which starts over
from what the store holds (under strict durability: every accepted message that
did not finish runs again).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from subagents.protocol import ErrorCode, SessionId, SubagentError

__all__ = ["PersistenceFailure", "PersistenceFailures", "SessionStatistics"]


@dataclass(frozen=True, slots=True)
class PersistenceFailure:
    """One session whose writes stopped at a failure.

    ``code`` is the failure's :class:`~subagents.protocol.ErrorCode` (``INTERNAL``
    for an exception that is not a ``SubagentError``), ``message`` its text, ``at``
    the wall-clock time (``time.time()``) it was seen.
    """

    session_id: SessionId
    code: str
    message: str
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionStatistics:
    """What ``runtime.sessions.statistics()`` returns.

    ``live_sessions``: sessions live in this runtime. ``failed_writes``: session
    writes that failed since the runtime started (each failed session counts once
    per activation). ``persistence_failures``: the sessions whose writes stopped at a
    failure and that were not activated again since, oldest first: the latest
    1,000 (``KEPT_FAILURES``). ``store``: the store's own counters
    (``statistics()`` of a SQL store), or ``None``.
    """

    live_sessions: int
    failed_writes: int
    persistence_failures: tuple[PersistenceFailure, ...]
    store: Any


#: How many failed sessions ``statistics()`` lists at most (the latest).
KEPT_FAILURES = 1000
#: How many failed sessions the table remembers for ``flush`` (the latest).
KEPT_UNWRITTEN = 100_000


class PersistenceFailures:
    """The failure table: written by the writer task, read by any thread.

    A session's entry is kept until it is activated here again, which a one-shot
    child, a disposed agent or one resumed elsewhere never is: so the table keeps
    the latest :data:`KEPT_UNWRITTEN` (an outage would otherwise leave every
    session writing then here for good), and ``statistics()`` lists the latest
    :data:`KEPT_FAILURES`. A write refused for a lost lease is kept too, for
    ``flush`` to say so, but is no failure of persistence: not counted, not listed.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._by_session: dict[SessionId, PersistenceFailure] = {}
        self._clock = clock
        self.count = 0

    def record(self, session_id: SessionId, error: BaseException) -> None:
        """A write of ``session_id`` failed (the first failure is the cause)."""
        code = error.code if isinstance(error, SubagentError) else ErrorCode.INTERNAL
        failure = PersistenceFailure(session_id, str(code), str(error)[:1000], self._clock())
        with self._lock:
            table = self._by_session
            if session_id in table:
                return
            if code != ErrorCode.LEASE_LOST:
                self.count += 1  # (once an activation: forget() starts the next)
            table[session_id] = failure
            if len(table) > KEPT_UNWRITTEN:
                del table[next(iter(table))]  # the oldest

    def get(self, session_id: SessionId) -> PersistenceFailure | None:
        failure = self._by_session.get(session_id)
        return None if failure is None or failure.code == ErrorCode.LEASE_LOST else failure

    def forget(self, session_id: SessionId) -> None:
        with self._lock:
            self._by_session.pop(session_id, None)

    def snapshot(self) -> tuple[PersistenceFailure, ...]:
        """The latest :data:`KEPT_FAILURES` failures, oldest first."""
        with self._lock:
            values = list(self._by_session.values())
        listed = [f for f in reversed(values) if f.code != ErrorCode.LEASE_LOST]
        return tuple(reversed(listed[:KEPT_FAILURES]))

    def unwritten(self, session_id: SessionId) -> SubagentError | None:
        """What ``flush(session_id)`` raises once the writer forgot the failure (the
        activation ended at it): the failure's own code and message."""
        failure = self._by_session.get(session_id)
        if failure is None:
            return None
        return SubagentError(
            f"session {session_id} did not reach persistence: {failure.message}",
            code=failure.code,
        )

    def error(self, session_id: SessionId) -> SubagentError | None:
        """The error an agent whose writes failed raises instead of accepting."""
        failure = self.get(session_id)
        if failure is None:
            return None
        return SubagentError(
            f"session {session_id} stopped accepting: its write failed: {failure.message}",
            code=ErrorCode.PERSISTENCE_UNAVAILABLE,
            hint={"session_id": str(session_id), "cause": failure.code},
        )
