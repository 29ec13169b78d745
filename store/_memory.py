"""``MemoryStore``: the live-only store (``Runtime(store=None)``).

It keeps the event objects themselves, never encoded: same-process values are
borrowed, not copied (R-REG-9), and it sits on the follow-up hot path, so an
append is a lock, a dict lookup and a list extend. The runtime's own appends
(:meth:`_append_owned`) may hand it a turn as a compact
:class:`~subagents.protocol.TurnRecord` in each of its slots: a read builds the
events then. One lock guards everything; it
is never held across a call out of this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from subagents.protocol import (
    CorruptRecordError,
    Event,
    MessageId,
    SessionHeader,
    SessionId,
    TurnRecord,
)

from ._base import LogRecord, SessionStore, not_found, session_exists, store_closed
from ._durable import LeaseToken, NewLease
from ._memory_queues import MemoryQueues, QueueState
from ._native import native_lock
from ._promises import Promises
from ._validate import (
    check_blob,
    check_events,
    check_header,
    check_int,
    check_message_ids,
    check_messages,
    check_new_lease,
    check_seconds,
    check_session_id,
    check_session_ids,
    check_token,
    check_unit,
    invalid,
)

__all__ = ["MemoryStore"]


class _Session:
    __slots__ = ("checkpoint", "events", "header", "projections", "promised", "queues")

    def __init__(self, header: SessionHeader, events: list[Event | TurnRecord]) -> None:
        self.header = header
        self.events = events  # one slot per seq: an event, or the turn record it is in
        self.checkpoint: tuple[int, bytes] | None = None
        self.projections: dict[str, tuple[int, bytes]] = {}
        self.queues: QueueState | None = None  # inbox and lease, made on first use
        self.promised: dict[MessageId, None] = {}  # open promises (see ._promises)


def _ordered(headers: list[SessionHeader]) -> list[SessionHeader]:
    headers.sort(key=lambda h: (h.created_at, h.id))
    return headers


class MemoryStore(MemoryQueues, Promises, SessionStore):
    """Sessions in this process's memory; nothing survives it.

    Events are stored as given (no encoding, so content the codec could not pack
    is accepted here and refused by :class:`SqliteStore`). Reads never raise
    :class:`CorruptRecordError`: nothing is decoded.
    """

    durable = False
    blocking = False
    inline_writes = True  # an append is a lock and a list extend

    def __init__(self) -> None:
        self._lock = native_lock()
        self._sessions: dict[SessionId, _Session] = {}
        self._holders: dict[str, float] = {}
        self._children: dict[SessionId | None, set[SessionId]] = {}
        self._closed = False

    def _get(self, session_id: SessionId) -> _Session:
        # Caller holds the lock.
        if self._closed:
            raise store_closed(self)
        session = self._sessions.get(session_id)
        if session is None:
            raise not_found(session_id)
        return session

    def create_session(
        self,
        header: SessionHeader,
        events: Sequence[Event] = (),
        *,
        lease: NewLease | None = None,
        inbox: Sequence[Event] = (),
    ) -> int:
        header = check_header(header)
        initial: list[Event | TurnRecord] = list(check_events(events))
        new_lease = check_new_lease(lease)
        messages = check_messages(inbox)
        with self._lock:
            if self._closed:
                raise store_closed(self)
            if header.id in self._sessions:
                raise session_exists(header.id)
            session = self._sessions[header.id] = _Session(header, initial)
            self._children.setdefault(header.parent_session, set()).add(header.id)
            if new_lease is not None or messages:
                session.queues = QueueState.fresh(header.id, new_lease, messages)
        return len(initial) - 1

    def append(
        self,
        session_id: SessionId | str,
        events: Sequence[Event],
        *,
        lease: LeaseToken | None = None,
        done: Sequence[MessageId] = (),
    ) -> list[int]:
        sid = check_session_id(session_id)
        events = check_events(events)
        token = None if lease is None else check_token(lease)
        finished = check_message_ids(done) if done else ()
        with self._lock:
            session = self._get(sid)
            if token is not None or finished:
                state = self._queues(sid)
                self._fence(sid, state, token)
                state.mark_done(finished)
            log = session.events
            start = len(log)
            log.extend(events)
        return list(range(start, start + len(events)))

    def _owned_appender(self) -> Callable[[SessionId, Sequence[Event]], object]:
        if type(self).append is not MemoryStore.append:
            return self.append  # a subclass's own append (a hook, a fault) must run
        return self._append_owned

    def _takes_turn_records(self) -> bool:
        return type(self).append is MemoryStore.append

    def _append_owned(self, session_id: SessionId, events: Sequence[Event | TurnRecord]) -> None:
        # The runtime's inline writer, once a turn: no argument checks (see
        # SessionStore._owned_appender) and no seq list nobody reads.
        #
        # And no store lock on the common path. Every resident child appends here
        # once a turn; on threads, a GIL switch inside that one shared critical
        # section parked the next child on the lock (a context switch each), and
        # with 100 children this was most of their waiting. A dict read and a
        # list extend are each atomic, and an events list is only ever extended:
        # an append that races a delete or a close lands in a list nobody can read
        # any more, as if it had come just before them.
        session = self._sessions.get(session_id)
        if session is None or self._closed:
            with self._lock:
                session = self._get(session_id)  # STORE_CLOSED, SESSION_NOT_FOUND
        session.events.extend(events)

    def read(self, session_id: SessionId | str, from_seq: int = 0) -> list[LogRecord]:
        sid = check_session_id(session_id)
        check_int(from_seq, "from_seq")
        with self._lock:
            tail = self._get(sid).events[from_seq:]
        return [  # TurnRecord is never subclassed: a type identity test, not isinstance
            LogRecord(seq, e.event(seq) if type(e) is TurnRecord else e)
            for seq, e in enumerate(tail, from_seq)
        ]

    def scan(
        self, session_id: SessionId | str, from_seq: int = 0
    ) -> Iterator[LogRecord | CorruptRecordError]:
        # A snapshot taken now: later appends are not seen, like a read transaction.
        return iter(self.read(session_id, from_seq))

    def header(self, session_id: SessionId | str) -> SessionHeader | None:
        sid = check_session_id(session_id)
        with self._lock:
            if self._closed:
                raise store_closed(self)
            session = self._sessions.get(sid)
        return None if session is None else session.header

    def exists(self, session_id: SessionId | str) -> bool:
        return self.header(session_id) is not None

    def last_seq(self, session_id: SessionId | str) -> int:
        sid = check_session_id(session_id)
        with self._lock:
            return len(self._get(sid).events) - 1

    def raise_delegation_depth(self, session_id: SessionId | str, depth: int) -> SessionHeader:
        sid = check_session_id(session_id)
        check_int(depth, "depth")
        with self._lock:
            session = self._get(sid)
            if depth > session.header.delegation_depth:
                session.header = replace(session.header, delegation_depth=depth)
            return session.header

    def list_headers(self, parent_session: SessionId | str | None) -> list[SessionHeader]:
        parent = None if parent_session is None else check_session_id(parent_session)
        with self._lock:
            if self._closed:
                raise store_closed(self)
            ids = self._children.get(parent, ())
            headers = [self._sessions[i].header for i in ids]
        return _ordered(headers)

    def scan_children(
        self, parents: Sequence[SessionId | str]
    ) -> list[SessionHeader | CorruptRecordError]:
        wanted = check_session_ids(parents)
        with self._lock:
            if self._closed:
                raise store_closed(self)
            headers = [self._sessions[i].header for p in wanted for i in self._children.get(p, ())]
        return list(_ordered(headers))

    def all_headers(self) -> list[SessionHeader]:
        with self._lock:
            if self._closed:
                raise store_closed(self)
            headers = [s.header for s in self._sessions.values()]
        return _ordered(headers)

    def owe(
        self,
        session_id: SessionId | str,
        add: Sequence[MessageId] = (),
        drop: Sequence[MessageId] = (),
        *,
        lease: LeaseToken | None = None,
        clear: bool = False,
    ) -> None:
        sid = check_session_id(session_id)
        adds, drops, token = check_message_ids(add), check_message_ids(drop), check_token(lease)
        if type(clear) is not bool:
            raise invalid("clear must be a bool")
        with self._lock:
            session = self._get(sid)
            self._fence(sid, self._queues(sid), token)
            owed = session.promised
            if clear:
                owed.clear()
            for mid in drops:
                owed.pop(mid, None)
            owed.update(dict.fromkeys(adds))

    def owed(self, session_id: SessionId | str) -> list[MessageId]:
        sid = check_session_id(session_id)
        with self._lock:
            return list(self._get(sid).promised)

    def _apply(self, op: tuple[Any, ...]) -> Any:
        if op[0] == "owe":
            return self.owe(op[1], *op[3:5], lease=op[2], clear=op[5] if len(op) > 5 else False)
        return super()._apply(op)

    def orphans(self, now: float) -> list[SessionId]:
        out = super().orphans(now)  # (checks ``now``)
        with self._lock:
            for sid, session in self._sessions.items():
                if not session.promised or sid in out:
                    continue
                lease = None if session.queues is None else self._live(session.queues.lease)
                if lease is None or lease.holder is None or lease.expires <= now:
                    out.append(sid)  # owed a message: accepted work (see ._promises)
        return out

    def leased_work(self, prefix: str, now: float) -> list[tuple[SessionId, str]]:
        at = check_seconds(now, "now")
        if type(prefix) is not str:
            raise invalid("prefix must be a str")
        with self._lock:
            if self._closed:
                raise store_closed(self)
            out = []
            for sid, session in self._sessions.items():
                state = session.queues
                if state is None:
                    continue  # never leased
                lease = self._live(state.lease)
                if lease is None or lease.holder is None or lease.expires <= at:
                    continue
                if lease.holder.startswith(prefix) and (
                    session.promised or any(not e.done for e in state.inbox.values())
                ):
                    out.append((sid, lease.holder))
            return out

    def delete_session(self, session_id: SessionId | str) -> None:
        sid = check_session_id(session_id)
        with self._lock:
            if self._closed:
                raise store_closed(self)
            self._drop(sid)

    def _drop(self, session_id: SessionId) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            siblings = self._children[session.header.parent_session]
            siblings.discard(session_id)
            if not siblings:
                del self._children[session.header.parent_session]

    def put_checkpoint(
        self,
        session_id: SessionId | str,
        seq: int,
        data: bytes,
        *,
        lease: LeaseToken | None = None,
    ) -> None:
        sid = check_session_id(session_id)
        check_int(seq, "seq")
        blob = check_blob(data)
        token = None if lease is None else check_token(lease)
        with self._lock:
            session = self._get(sid)
            if token is not None:
                self._fence(sid, self._queues(sid), token)
            if seq >= len(session.events):
                raise invalid(
                    f"checkpoint seq {seq} is past the last seq {len(session.events) - 1}",
                    session_id=sid,
                    seq=seq,
                )
            session.checkpoint = (seq, blob)

    def put_projection(self, session_id: SessionId | str, unit: str, seq: int, data: bytes) -> None:
        sid = check_session_id(session_id)
        check_unit(unit)
        check_int(seq, "seq", minimum=-1)
        blob = check_blob(data)
        with self._lock:
            self._get(sid).projections[unit] = (seq, blob)

    def get_projection(self, session_id: SessionId | str, unit: str) -> tuple[int, bytes] | None:
        sid = check_session_id(session_id)
        with self._lock:
            if self._closed:
                raise store_closed(self)
            session = self._sessions.get(sid)
            return None if session is None else session.projections.get(unit)

    def get_projections(self, unit: str) -> dict[SessionId, tuple[int, bytes]]:
        with self._lock:
            if self._closed:
                raise store_closed(self)
            return {
                sid: session.projections[unit]
                for sid, session in self._sessions.items()
                if unit in session.projections
            }

    def get_projections_of(
        self, unit: str, sessions: Iterable[SessionId | str]
    ) -> dict[SessionId, tuple[int, bytes]]:
        check_unit(unit)
        wanted = check_session_ids(sessions)
        with self._lock:
            if self._closed:
                raise store_closed(self)
            found = {sid: self._sessions.get(sid) for sid in wanted}
            return {
                sid: session.projections[unit]
                for sid, session in found.items()
                if session is not None and unit in session.projections
            }

    def drop_projections(self) -> None:
        with self._lock:
            if self._closed:
                raise store_closed(self)
            for session in self._sessions.values():
                session.projections.clear()

    def get_checkpoint(self, session_id: SessionId | str) -> tuple[int, bytes] | None:
        sid = check_session_id(session_id)
        with self._lock:
            if self._closed:
                raise store_closed(self)
            session = self._sessions.get(sid)
            return None if session is None else session.checkpoint

    def flush(self, session_id: SessionId | str | None = None) -> None:
        if session_id is not None:
            check_session_id(session_id)
        if self._closed:
            raise store_closed(self)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._sessions.clear()
            self._children.clear()
