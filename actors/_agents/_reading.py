"""Reading sessions: the live tail merged over what persistence holds.

Mixed into :class:`~._sessions.SessionService`, which provides the members
declared below.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from subagents.protocol import (
    CorruptRecordError,
    ErrorCode,
    MessageId,
    SessionHeader,
    SessionId,
    SubagentDescriptorEvent,
    SubagentError,
    TurnEnd,
    unpackb,
)
from subagents.store import LogRecord, SessionStore

from ._live import LiveSession

__all__ = ["SessionReads"]

logger = logging.getLogger("subagents")


class SessionReads:
    """Mixed into :class:`~._sessions.SessionService` (which provides the members below)."""

    persistence: SessionStore | None
    _live: dict[SessionId, LiveSession]
    _lock: threading.Lock
    #: ``WRONG_PROCESS``, in the child of a fork: every session here is the parent's.
    inherited: SubagentError | None = None
    #: The runtime closed (``close()``): without persistence nothing is left to read.
    closed: bool = False

    def check_process(self) -> None:
        """Raise ``WRONG_PROCESS`` in the child of a fork (see ``_kernel/_fork.py``)."""
        if self.inherited is not None:
            raise self.inherited

    def check_kept(self) -> None:
        """``STORE_CLOSED`` once the runtime closed when it has no persistence: its
        sessions ended with it, so "no session" (what a lookup finds) would read as
        if the session never was -- a runtime with a store says ``STORE_CLOSED`` too."""
        if self.closed and self.persistence is None:
            raise SubagentError(
                "the runtime is closed: without a store its sessions ended with it",
                code=ErrorCode.STORE_CLOSED,
            )

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def flush(self, session_id: SessionId | None = None, timeout: float | None = 30.0) -> None:
        raise NotImplementedError

    def header(self, session_id: SessionId) -> SessionHeader | None:
        """Live header, else the persisted one, else None (``INVALID_ARGUMENT``: no id;
        ``STORE_CLOSED``: the runtime closed, and it has no persistence)."""
        self.check_process()
        if type(session_id) is not SessionId:
            session_id = SessionId(session_id)  # before the lookup: a list is unhashable
        live = self._live.get(session_id)
        if live is not None:
            return live.header
        if self.persistence is None:
            self.check_kept()
            return None
        return self._call(self.persistence.header, session_id)  # type: ignore[no-any-return]

    def roots(self) -> list[SessionHeader]:
        """Every session without a parent, live or persisted, by ``(created_at, id)``;
        one whose stored header does not decode is left out (and logged): the
        others are still listed."""
        self.check_process()
        self.check_kept()
        with self._lock:
            found = {
                sid: live.header
                for sid, live in self._live.items()
                if live.header.parent_session is None
            }
        if self.persistence is not None:
            try:
                stored: list[SessionHeader] = self._call(self.persistence.list_headers, None)
            except CorruptRecordError:
                stored = self._readable_roots()
            found.update((h.id, h) for h in stored)
        return sorted(found.values(), key=lambda h: (h.created_at, h.id))

    def _readable_roots(self) -> list[SessionHeader]:
        """The stored roots whose headers decode (a scan of every header: only when
        one of them does not)."""
        assert self.persistence is not None
        out = []
        for found in self._call(self.persistence.scan_headers):
            if isinstance(found, CorruptRecordError):
                if found.hint.get("parent_session") is None:
                    logger.warning("a root left out of roots(): %s", found)
            elif found.parent_session is None:
                out.append(found)
        return out

    def read(self, session_id: SessionId, from_seq: int = 0) -> list[LogRecord]:
        """The log from ``from_seq``: persisted prefix plus the live tail.

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``; ``CorruptRecordError`` for a bad row;
                ``INVALID_ARGUMENT`` for a ``from_seq`` that is no int from 0;
                ``STORE_CLOSED`` once the runtime closed (the store's own, or, without
                persistence, the session service's).
        """
        self.check_process()
        if type(session_id) is not SessionId:
            session_id = SessionId(session_id)  # before the lookup: a list is unhashable
        if type(from_seq) is not int or from_seq < 0:
            raise SubagentError(
                f"from_seq must be an int >= 0, got {from_seq!r}", code=ErrorCode.INVALID_ARGUMENT
            )
        return self._merged(session_id, from_seq, None)

    def read_decodable(self, session_id: SessionId, damaged: list[int]) -> list[LogRecord]:
        """The whole log as :meth:`read` gives it, but a stored row that does not
        decode is left out and its seq appended to ``damaged`` (a scan: for a log
        known to hold one, where :meth:`read` raises).

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``.
        """
        self.check_process()
        return self._merged(session_id, 0, damaged)

    def _merged(
        self, session_id: SessionId, from_seq: int, damaged: list[int] | None
    ) -> list[LogRecord]:
        """The persisted prefix plus the live tail (see :meth:`read`, :meth:`read_decodable`)."""
        live = self._live.get(session_id)
        records: list[LogRecord] = []
        if live is not None:
            base, tail = live.snapshot()
            if from_seq < base and self.persistence is not None:
                bad: list[int] | None = None if damaged is None else []
                persisted = self._persisted(session_id, from_seq, bad)
                records.extend(r for r in persisted if r.seq < base)
                if bad and damaged is not None:
                    damaged.extend(s for s in bad if s < base)
            start = max(from_seq, base)
            records.extend(
                LogRecord(seq=base + i, event=e) for i, e in enumerate(tail) if base + i >= start
            )
            return records
        if self.persistence is None:
            self.check_kept()
            raise SubagentError(f"no session {session_id}", code=ErrorCode.SESSION_NOT_FOUND)
        return self._persisted(session_id, from_seq, damaged)

    def _persisted(
        self, session_id: SessionId, from_seq: int, damaged: list[int] | None
    ) -> list[LogRecord]:
        """The stored log from ``from_seq``; with a ``damaged`` list, rows that do
        not decode are left out and their seqs appended to it (else they raise)."""
        store = self.persistence
        assert store is not None
        if damaged is None:
            result: list[LogRecord] = self._call(store.read, session_id, from_seq)
            return result
        records: list[LogRecord] = []
        for row in self._call(lambda: list(store.scan(session_id, from_seq))):
            if isinstance(row, LogRecord):
                records.append(row)
            else:
                damaged.append(row.seq)
        return records

    def stored_children(self, parents: list[SessionId]) -> list[SessionHeader]:
        """The stored headers of ``parents``' children that decode (none without
        persistence).

        Raises:
            SubagentError: the store's (``PERSISTENCE_UNAVAILABLE``...).
        """
        store = self.persistence
        if store is None or not parents:
            return []
        found = self._call(store.scan_children, parents)
        return [h for h in found if isinstance(h, SessionHeader)]

    def one_shot(self, header: SessionHeader) -> bool:
        """Whether the stored subagent session ``header`` names is a one-shot child's
        (its descriptor says so; a log that cannot say: False)."""
        store = self.persistence
        if store is None or header.origin != "subagent":
            return False

        def first() -> Any:
            for item in store.scan(header.id, header.seed_len):
                return getattr(item, "event", None)
            return None

        try:
            event = self._call(first)
        except SubagentError:
            return False
        return (
            isinstance(event, SubagentDescriptorEvent) and event.payload.get("mode") == "one-shot"
        )

    def turn_ends(self, session_id: SessionId | str) -> list[TurnEnd]:
        """The session's ended turns, in order: each :class:`~subagents.protocol.TurnEnd`
        carries ``turn``, ``stop_reason``, ``output`` and ``error`` -- the typed way to
        read what a turn produced (``turn_ends(sid)[-1].output``).

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``, ``CORRUPT_RECORD``,
                ``INVALID_ARGUMENT`` (not a session id).
        """
        sid = session_id if type(session_id) is SessionId else SessionId(session_id)
        return [r.event for r in self.read(sid) if isinstance(r.event, TurnEnd)]

    def load_state(
        self, session_id: SessionId, damaged: list[int] | None = None
    ) -> tuple[SessionHeader, int, dict[str, Any] | None, list[LogRecord]]:
        """``(header, next_seq, checkpoint, records after it)`` from persistence.

        Without a usable checkpoint ``records`` is the whole log. With a ``damaged``
        list, rows that do not decode are left out and their seqs appended to it.

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``, ``PERSISTENCE_UNAVAILABLE``,
                ``CORRUPT_RECORD`` (a row that does not decode, without ``damaged``).
        """
        store = self.persistence
        if store is None:
            raise SubagentError(
                "resume needs session persistence", code=ErrorCode.PERSISTENCE_UNAVAILABLE
            )
        self.flush()
        header = self._call(store.header, session_id)
        if header is None:
            raise SubagentError(
                f"no persisted session {session_id}", code=ErrorCode.SESSION_NOT_FOUND
            )
        state: dict[str, Any] | None = None
        from_seq = 0
        # A store that cannot be read fails the resume; a checkpoint that does not
        # decode is only ignored (the whole log is read instead).
        try:
            found = self._call(store.get_checkpoint, session_id)
        except CorruptRecordError:
            found = None  # its row holds values of the wrong kind
            logger.warning("ignoring an unreadable checkpoint of %s", session_id)
        if found is not None:
            try:
                decoded = unpackb(found[1])
            except SubagentError:
                decoded = None
            if _checkpoint_state(decoded, found[0]):
                state, from_seq = decoded, found[0] + 1
            else:
                logger.warning("ignoring an unreadable checkpoint of %s", session_id)
        records = self._persisted(session_id, from_seq, damaged)
        last = self._call(store.last_seq, session_id)
        return header, last + 1, state, records


def _checkpoint_state(decoded: Any, seq: int) -> bool:
    """Whether ``decoded`` is a checkpoint's state, valid through ``seq``, of the
    shape a resume reads (a damaged one is ignored: the whole log is read)."""
    if not isinstance(decoded, dict) or decoded.get("v") != 1 or decoded.get("seq") != seq:
        return False
    turn = decoded.get("next_turn", 0)
    return (
        type(turn) is int
        and turn >= 0
        # Quiet reports, and promised messages (see ._expected): [id, content, *source].
        and _messages(decoded.get("context"))
        and _messages(decoded.get("expected"), MessageId)
        and all(
            decoded.get(k) is None or isinstance(decoded[k], dict)
            for k in ("descriptor", "options")
        )
    )


def _messages(kept: Any, ids: type | None = None) -> bool:
    """Whether a checkpoint's list of messages (``[id, content, *source]``, each id
    an ``ids`` when given) reads."""
    return kept is None or (
        isinstance(kept, list)
        and all(
            isinstance(c, list) and 2 <= len(c) <= 4 and (ids is None or type(c[0]) is ids)
            for c in kept
        )
    )
