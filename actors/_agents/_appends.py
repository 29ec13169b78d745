"""Appends to a live session: events, and a turn's record at its start and end.

A mixin of :class:`~._sessions.SessionService` (its ``_writer``): the one place a
live session's log grows, each append under the session's lock so the live log
and persistence take the same writes in the same order (and so the same seqs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from subagents.protocol import ErrorCode, Event, MessageId, SubagentError, TurnRecord

from ._live import LiveSession

__all__ = ["Appends"]


class Appends:
    """Appends to live sessions (see the module docstring)."""

    _writer: Any  # ._writer.Writer | None

    def append(
        self,
        live: LiveSession,
        events: Sequence[Event],
        *,
        defer: bool = False,
        done: Sequence[MessageId] = (),
    ) -> int:
        """Append to a live session; returns the last seq. Persistence follows behind.

        ``defer=True`` lets an inline-written store (``inline_writes``) take these
        events with the session's next append, flush or checkpoint instead of now:
        the turn loop defers ``turn/start`` to its ``turn/end`` (one store write a
        turn). Reads merge the live tail, so nothing is hidden from the runtime.
        A write-behind store ignores it.
        """
        if live.released:
            raise _gone(live)
        return live._append(events, self._writer, defer, done)

    def begin_turn(self, live: LiveSession, record: TurnRecord) -> None:
        """Append a turn's head (``turn/start`` to its message) as ``record``'s slots.

        An inline-written store takes them with the turn's end (one store write
        a turn); a write-behind store gets the head's events now, so a turn that a
        crash cuts short is in the log. Reads merge the live tail either way.
        """
        if live.released:
            raise _gone(live)
        writer = self._writer
        size = record.size
        with live._lock:
            record.seq = seq = live.next_seq
            live.next_seq = seq + size
            if writer is None or writer.inline:
                live.events.extend((record,) * size)
            else:
                head = record.head()
                live.events.extend(head)
                live.last_ticket = writer.submit("append", live.header.id, (head, live.token, ()))

    def end_turn(
        self, live: LiveSession, record: TurnRecord, done: Sequence[MessageId], later: bool = False
    ) -> None:
        """Append the turn's end (``record.end`` is set) and, with it, mark ``done``
        the messages the turn ran (they leave the durable inbox in the same write).
        ``later``: an inline-written store takes the turn with a later turn's end or
        :meth:`write_tail` (a run of queued turns is one store write)."""
        if live.released:
            raise _gone(live)
        writer = self._writer
        with live._lock:
            record.end_seq = live.next_seq
            live.next_seq += 1
            if writer is None:
                live.events.append(record)
                return
            if not writer.inline:
                end = record.end_event()
                live.events.append(end)
                live.last_ticket = writer.submit(
                    "append", live.header.id, ((end,), live.token, done)
                )
                return
            live.events.append(record)
            if later or live._write_inline(writer):
                return
        writer.report()  # it failed: the agent stops, with the session's lock released

    def write_tail(self, live: LiveSession) -> None:
        """An inline-written store takes what ``end_turn(later=True)`` left in the tail."""
        if self._writer is not None and self._writer.inline:
            live._write_pending(self._writer)


def _gone(live: LiveSession) -> SubagentError:
    return SubagentError(f"session {live.id} is no longer live", code=ErrorCode.SESSION_NOT_FOUND)
