"""The in-memory state of one live session."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from subagents.protocol import (
    Event,
    MessageId,
    SessionHeader,
    SessionId,
    SubagentError,
    TurnRecord,
    materialise,
)

if TYPE_CHECKING:
    from ._writer import Writer

__all__ = ["LiveSession"]

logger = logging.getLogger("subagents")


class LiveSession:
    """In-memory state of one live session (owned by :class:`SessionService`)."""

    __slots__ = (
        "_lock",
        "base_seq",
        "deduplicated",
        "events",
        "header",
        "id",
        "inbox_n",
        "last_ticket",
        "next_seq",
        "projection_mark",
        "released",
        "replay_due",
        "stood_back",
        "token",
        "unrun",
        "written",
    )

    def __init__(
        self, header: SessionHeader, next_seq: int, token: tuple[str, int] | None = None
    ) -> None:
        self.header = header
        #: The session's id (its header's, read often enough to keep at hand).
        self.id: SessionId = header.id
        self.token = token  # the lease every write of this session carries (None: no leases)
        self.base_seq = next_seq  # seq of events[0]
        self.next_seq = next_seq
        # One slot per seq from base_seq: an event, or the TurnRecord it is part of.
        self.events: list[Event | TurnRecord] = []
        self.released = False
        self.projection_mark: Any = None  # the listing's watermark (ProjectionRegistry)
        self.last_ticket = 0  # the writer ticket of this session's latest write
        self.written = next_seq  # inline writes: events from this seq on are not stored yet
        # Messages this activation took and stops without running (the runtime is
        # closing): its lease release gives them back to nobody.
        self.unrun: list[MessageId] | None = None
        # The durable inbox place up to which this activation knows nobody left a
        # message untaken (0: none yet) -- its own commits' places, and the gaps it
        # looked into: a follow-up committed further on, past a gap, may have been
        # preceded by messages another process committed that nobody took yet.
        self.inbox_n = 0
        # A resumed activation whose replay of its pending messages is not queued
        # yet: nothing else may be queued before it (see _ahead.replay_first).
        self.replay_due = False
        self.stood_back = False  # a taker left its messages to the pickup meanwhile
        self.deduplicated = 0  # messages offered again under an accepted id (statistics)
        self._lock = threading.Lock()

    def _append(
        self,
        events: Sequence[Event],
        writer: Writer | None = None,
        defer: bool = False,
        done: Sequence[MessageId] = (),
    ) -> int:
        # One lock for the live append and the persistence hand-off keeps both
        # logs in the same order (and so with the same seqs).
        with self._lock:
            self.events.extend(events)
            self.next_seq += len(events)
            last = self.next_seq - 1
            if writer is None:
                return last
            if not writer.inline:
                self.last_ticket = writer.submit(
                    "append", self.header.id, (events, self.token, done)
                )
                return last
            if defer or self._write_inline(writer):
                return last
        writer.report()  # it failed: the agent stops, with this lock released
        return last

    def _write_inline(self, writer: Writer) -> bool:
        """Inline mode, lock held: store the events not stored yet, drop the tail.

        False when they were not stored: the caller calls ``writer.report()``
        once it released the lock (the failure stops the agent, whose abort
        listeners may append to or read this very session)."""
        written = self.written
        if written == self.next_seq:
            return True
        events = self.events
        pending = events if written == self.base_seq else events[written - self.base_seq :]
        if writer.write_through(self.header.id, written, pending):
            # The store holds the whole log now: no tail to keep.
            self.events.clear()
            self.base_seq = self.written = self.next_seq
            return True
        return False

    def _write_pending(self, writer: Writer) -> None:
        with self._lock:
            if self._write_inline(writer):
                return
        writer.report()  # (see _write_inline)

    def _checkpoint(
        self, writer: Writer, state: dict[str, Any], pack: Callable[[Any], bytes]
    ) -> None:
        """Queue a checkpoint of ``state`` through the last seq (``SessionService.checkpoint``):
        inline, the log through that seq is written first. The caller calls
        ``writer.report()`` after (see :meth:`_write_inline`)."""
        with self._lock:
            if writer.inline:
                self._write_inline(writer)  # the log through seq first
            seq = self.next_seq - 1
            if seq < 0:
                return
            try:
                data = pack({"v": 1, "seq": seq, **state})
            except SubagentError as exc:  # never breaks a release: resume refolds the log
                logger.error(
                    "no checkpoint of %s: %s (its resume refolds the log; quiet reports kept"
                    " for its next turn stay only in a strict inbox)",
                    self.id,
                    exc,
                )
                return
            # Fenced by its lease: a holder that lost the session stores no state.
            self.last_ticket = writer.submit(
                "checkpoint", self.id, (seq, data, self.token), report=False
            )

    def _trim_through(self, seq: int) -> None:
        with self._lock:
            drop = min(seq + 1 - self.base_seq, len(self.events))
            if drop > 0:
                del self.events[:drop]
                self.base_seq += drop

    def snapshot(self) -> tuple[int, list[Event]]:
        """``(base_seq, tail)``: the events from ``base_seq`` on, held in memory."""
        with self._lock:
            base, tail = self.base_seq, list(self.events)
        return base, materialise(base, tail)
