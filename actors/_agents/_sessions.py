"""The session service (``runtime.sessions``): live sessions plus optional persistence.

A *live* session belongs to a live agent: its header and the tail of its log that
has not yet reached persistence are held in memory. *Persistence* is an optional
:class:`~subagents.store.SessionStore` (SQLite by default, or any store). Writes to
persistence are **write-behind**: ``append`` returns once the events are in the
live log, and one writer task (a thread, or a greenlet that runs blocking store
calls in gevent's threadpool) drains every queued write in order and commits it.
``flush(session_id)`` waits until everything appended to that session so far is
committed, so an agent that settles can make its log durable before it leaves
residency. A store that declares ``inline_writes`` (the in-memory store) is
written synchronously by the appending thread instead, in the same order, with
no writer task at all. Without persistence the live log is the whole log and a session
vanishes when its agent is released.

Seqs are assigned here, gapless from 0 per session, and persistence assigns the
same ones because it receives the same writes in the same order.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from subagents.actors._kernel._backend import Backend, TaskHandle
from subagents.actors._kernel._future import _Waiter
from subagents.protocol import (
    ErrorCode,
    Event,
    SessionHeader,
    SessionId,
    SubagentError,
    packb,
    unpackb,
)
from subagents.protocol._codec import pack_shaped
from subagents.store import LogRecord, SessionStore

__all__ = ["LiveSession", "SessionService"]

logger = logging.getLogger("subagents")


class LiveSession:
    """In-memory state of one live session (owned by :class:`SessionService`)."""

    __slots__ = (
        "_lock",
        "base_seq",
        "events",
        "header",
        "last_ticket",
        "next_seq",
        "released",
        "written",
    )

    def __init__(self, header: SessionHeader, next_seq: int) -> None:
        self.header = header
        self.base_seq = next_seq  # seq of events[0]
        self.next_seq = next_seq
        self.events: list[Event] = []
        self.released = False
        self.last_ticket = 0  # the writer ticket of this session's latest write
        self.written = next_seq  # inline writes: events from this seq on are not stored yet
        self._lock = threading.Lock()

    @property
    def id(self) -> SessionId:
        return self.header.id

    def _append(
        self, events: Sequence[Event], writer: _Writer | None = None, defer: bool = False
    ) -> int:
        # One lock for the live append and the persistence hand-off keeps both
        # logs in the same order (and so with the same seqs).
        with self._lock:
            self.events.extend(events)
            self.next_seq += len(events)
            if writer is not None:
                if writer.inline:
                    if not defer:
                        self._write_inline(writer)
                else:
                    self.last_ticket = writer.submit("append", self.header.id, events)
            return self.next_seq - 1

    def _write_inline(self, writer: _Writer) -> None:
        """Inline mode, lock held: store the events not stored yet, drop the tail."""
        if self.written == self.next_seq:
            return
        pending = self.events[self.written - self.base_seq :]
        if writer.write_through(self.header.id, pending):
            # The store holds the whole log now: no tail to keep.
            self.events.clear()
            self.base_seq = self.written = self.next_seq

    def _write_pending(self, writer: _Writer) -> None:
        with self._lock:
            self._write_inline(writer)

    def _trim_through(self, seq: int) -> None:
        with self._lock:
            drop = min(seq + 1 - self.base_seq, len(self.events))
            if drop > 0:
                del self.events[:drop]
                self.base_seq += drop

    def snapshot(self) -> tuple[int, list[Event]]:
        """``(base_seq, tail)``: the events from ``base_seq`` on, held in memory."""
        with self._lock:
            return self.base_seq, list(self.events)


class _Writer:
    """The write-behind queue to persistence: one task, writes in order.

    A store that allows it (``store.inline_writes``: in memory, never blocks) is
    written *inline* instead (:meth:`write_through` for appends, :meth:`submit` for the
    other ops), by the caller under the writer lock: the same order, no task, and
    no thread or greenlet hand-off per write, which cost a follow-up's round trip
    more than the write itself.
    """

    def __init__(self, store: SessionStore, backend: Backend, sessions: SessionService) -> None:
        self._store = store
        self._backend = backend
        self._sessions = sessions
        self._ops: deque[tuple[int, str, SessionId, Any]] = deque()
        self._lock = threading.Lock()
        self._ticket = 0
        self._committed = 0
        self._wake = backend.event()
        self._waiters: list[tuple[int, Any]] = []
        self._failed: dict[SessionId, BaseException] = {}
        self._closing = False
        self._task: TaskHandle | None = None
        self._awake = False  # the writer is draining: no need to signal it again
        self.inline = store.inline_writes and not store.blocking
        self._append_owned = store._owned_appender()

    def submit(self, op: str, session_id: SessionId, payload: Any) -> int:
        with self._lock:
            if self._closing:
                raise SubagentError("the session service is closed", code=ErrorCode.STORE_CLOSED)
            self._ticket += 1
            ticket = self._ticket
            if self.inline:
                self._write([(ticket, op, session_id, payload)])
                self._committed = ticket
                return ticket
            self._ops.append((ticket, op, session_id, payload))
            if self._task is None:
                self._task = self._backend.spawn(self._run, name="subagents-session-writer")
            if self._awake:
                return ticket
            self._awake = True
        # Setting an event costs microseconds (a gevent one schedules a callback);
        # only the submit that finds the writer asleep pays it.
        self._wake.set()
        return ticket

    def write_through(self, session_id: SessionId, events: Sequence[Event]) -> bool:
        """Inline mode: append ``events`` to the store now; True when stored.

        The caller holds the session's lock, so the session's appends reach the
        store in seq order; no other order matters to an append, so the writer
        lock is not taken (the store has its own). A failure is logged and kept
        for ``flush`` to report, and the session gets no later writes (no holes in
        its log).
        """
        if self._closing:
            raise SubagentError("the session service is closed", code=ErrorCode.STORE_CLOSED)
        if session_id in self._failed:
            return False
        try:
            self._append_owned(session_id, events)
        except Exception as exc:
            logger.error("persisting session %s failed: %s", session_id, exc)
            self._failed[session_id] = exc
            return False
        return True

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self._drain()
            with self._lock:
                if self._ops:
                    self._wake.set()  # raced with a submit that saw us awake
                    continue
                self._awake = False
                if self._closing:
                    return

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._ops:
                    return
                batch: list[tuple[int, str, SessionId, Any]] = []
                while self._ops and len(batch) < 4096:
                    batch.append(self._ops.popleft())
            self._write(batch)
            with self._lock:
                self._committed = batch[-1][0]
                ready = [ev for t, ev in self._waiters if t <= self._committed]
                self._waiters = [(t, ev) for t, ev in self._waiters if t > self._committed]
            for ev in ready:
                ev.wake()

    def _call(self, fn: Any, *args: Any) -> Any:
        if self._store.blocking:
            return self._backend.run_blocking(fn, *args)
        return fn(*args)

    def _write(self, batch: list[tuple[int, str, SessionId, Any]]) -> None:
        """Write a batch through ``store.write_many``: one durable transaction.

        Runs of appends to one session are merged into one op. A session whose
        earlier write failed gets no later writes (no holes in its log).
        """
        ops: list[tuple[Any, ...]] = []
        owners: list[SessionId] = []
        i = 0
        while i < len(batch):
            _, op, sid, payload = batch[i]
            i += 1
            if sid in self._failed:
                continue
            if op == "append":
                events = list(payload)
                while i < len(batch) and batch[i][1] == "append" and batch[i][2] == sid:
                    events.extend(batch[i][3])
                    i += 1
                ops.append(("append", sid, events))
            elif op == "create":
                header, events = payload
                ops.append(("create", header, events))
            elif op == "delete":
                ops.append(("delete", sid))
            else:  # checkpoint, projection: payload is the rest of the op
                ops.append((op, sid, *payload))
            owners.append(sid)
        if not ops:
            return
        try:
            results = self._call(self._store.write_many, ops)
        except Exception as exc:  # the store itself failed: every session in the batch
            logger.exception("persisting a batch of %d writes failed", len(ops))
            results = [exc] * len(ops)
        for sid, done, result in zip(owners, ops, results):
            if isinstance(result, BaseException):
                if done[0] != "projection":  # derived data: a lost cache row is harmless
                    logger.error("persisting session %s failed: %s", sid, result)
                    self._failed[sid] = result
            elif done[0] == "append" and result:
                self._sessions._committed(sid, result[-1])

    def wait(self, ticket: int, timeout: float | None) -> bool:
        waiter = _Waiter()  # woken from the writer's thread, which may not be ours
        with self._lock:
            if self._committed >= ticket:
                return True
            self._waiters.append((ticket, waiter))
        return waiter.wait(timeout)

    def take_failure(self, sid: SessionId) -> BaseException | None:
        return self._failed.get(sid)

    def forget(self, sid: SessionId) -> None:
        self._failed.pop(sid, None)

    @property
    def ticket(self) -> int:
        return self._ticket

    def close(self) -> None:
        with self._lock:
            self._closing = True
            task = self._task
            self._awake = True
        self._wake.set()
        if task is not None:
            task.join()


class SessionService:
    """Live sessions of live agents, and write-behind to optional persistence.

    Thread-safe. ``persistence`` is ``None`` for a runtime without a store.
    """

    def __init__(self, persistence: SessionStore | None, backend: Backend) -> None:
        self.persistence = persistence
        self._backend = backend
        self._live: dict[SessionId, LiveSession] = {}
        self._lock = threading.Lock()
        self._writer = _Writer(persistence, backend, self) if persistence is not None else None

    # -- lifecycle of live sessions -------------------------------------------------

    def open(self, header: SessionHeader, events: Sequence[Event] = ()) -> LiveSession:
        """Create a new session, live and (write-behind) persisted.

        Raises:
            SubagentError: ``SESSION_EXISTS`` when the id is live or persisted.
        """
        live = LiveSession(header, 0)
        with self._lock:
            if header.id in self._live:
                raise SubagentError(f"session {header.id} exists", code=ErrorCode.SESSION_EXISTS)
            self._live[header.id] = live
        live._append(events)
        writer = self._writer
        if writer is not None:
            live.last_ticket = writer.submit("create", header.id, (header, list(events)))
            if writer.inline and writer.take_failure(header.id) is None:
                with live._lock:  # created with its initial events: nothing pending
                    live.events.clear()
                    live.base_seq = live.written = live.next_seq
        return live

    def attach(self, header: SessionHeader, next_seq: int) -> LiveSession:
        """Make a persisted session live again (cold resume); its log stays in persistence."""
        live = LiveSession(header, next_seq)
        with self._lock:
            if header.id in self._live:
                raise SubagentError(
                    f"session {header.id} is already live", code=ErrorCode.SESSION_EXISTS
                )
            self._live[header.id] = live
        return live

    def append(self, live: LiveSession, events: Sequence[Event], *, defer: bool = False) -> int:
        """Append to a live session; returns the last seq. Persistence follows behind.

        ``defer=True`` lets an inline-written store (``inline_writes``) take these
        events with the session's next append, flush or checkpoint instead of now:
        the turn loop defers ``turn/start`` to its ``turn/end`` (one store write a
        turn). Reads merge the live tail, so nothing is hidden from the runtime.
        A write-behind store ignores it.
        """
        if live.released:
            raise SubagentError(
                f"session {live.id} is no longer live", code=ErrorCode.SESSION_NOT_FOUND
            )
        return live._append(events, self._writer, defer)

    def checkpoint(self, live: LiveSession, state: dict[str, Any], *, shaped: bool = False) -> None:
        """Queue a checkpoint of folded ``state`` valid through the live log's last seq.

        Cold resume reads it instead of refolding the whole log, so its cost does
        not grow with the log. ``shaped=True``: the caller built ``state`` from
        values of known, shallow nesting, so the nesting check is skipped (every
        settle writes one; the check was a tenth of a drain's time).
        """
        pack = pack_shaped if shaped else packb
        if self._writer is None:
            return
        with live._lock:
            if self._writer.inline:
                live._write_inline(self._writer)  # the log through seq first
            seq = live.next_seq - 1
            if seq >= 0:
                live.last_ticket = self._writer.submit(
                    "checkpoint", live.id, (seq, pack({"v": 1, "seq": seq, **state}))
                )

    def cache_projection(
        self, live: LiveSession, unit: str, seq: int, value: Any, *, shaped: bool = False
    ) -> None:
        """Queue a durable projection-cache row (derived data) after the session's writes.

        ``shaped=True`` as for :meth:`checkpoint`.
        """
        if self._writer is not None:
            if self._writer.inline:
                live._write_pending(self._writer)  # the log through seq first
            ticket = self._writer.submit(
                "projection", live.id, (unit, seq, (pack_shaped if shaped else packb)(value))
            )
            with live._lock:
                live.last_ticket = max(live.last_ticket, ticket)

    def load_state(
        self, session_id: SessionId
    ) -> tuple[SessionHeader, int, dict[str, Any] | None, list[LogRecord]]:
        """``(header, next_seq, checkpoint, records after it)`` from persistence.

        Without a usable checkpoint ``records`` is the whole log.

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``, ``PERSISTENCE_UNAVAILABLE``.
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
        try:
            found = self._call(store.get_checkpoint, session_id)
            if found is not None:
                decoded = unpackb(found[1])
                if (
                    isinstance(decoded, dict)
                    and decoded.get("v") == 1
                    and decoded.get("seq") == found[0]
                ):
                    state, from_seq = decoded, found[0] + 1
        except SubagentError:
            logger.warning("ignoring an unreadable checkpoint of %s", session_id)
        records: list[LogRecord] = self._call(store.read, session_id, from_seq)
        last = self._call(store.last_seq, session_id)
        return header, last + 1, state, records

    def _committed(self, sid: SessionId, seq: int) -> None:
        live = self._live.get(sid)
        if live is not None:
            live._trim_through(seq)

    def release(self, live: LiveSession) -> None:
        """Drop a session from the live set (its agent left residency)."""
        with self._lock:
            if self._live.get(live.id) is live:
                del self._live[live.id]
            live.released = True

    def discard(self, live: LiveSession, timeout: float | None = 30.0) -> None:
        """Roll a session back: out of the live set and deleted from persistence."""
        self.release(live)
        if self._writer is not None:
            ticket = self._writer.submit("delete", live.id, None)
            self._writer.wait(ticket, timeout)
            self._writer.forget(live.id)

    # -- reading -------------------------------------------------------------------

    def live(self, session_id: SessionId) -> LiveSession | None:
        return self._live.get(session_id)

    def live_ids(self) -> list[SessionId]:
        with self._lock:
            return list(self._live)

    def header(self, session_id: SessionId) -> SessionHeader | None:
        """Live header, else the persisted one, else None."""
        live = self._live.get(session_id)
        if live is not None:
            return live.header
        if self.persistence is None:
            return None
        return self._call(self.persistence.header, session_id)  # type: ignore[no-any-return]

    def read(self, session_id: SessionId, from_seq: int = 0) -> list[LogRecord]:
        """The log from ``from_seq``: persisted prefix plus the live tail.

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``; ``CorruptRecordError`` for a bad row.
        """
        live = self._live.get(session_id)
        records: list[LogRecord] = []
        if live is not None:
            base, tail = live.snapshot()
            if from_seq < base and self.persistence is not None:
                persisted = self._call(self.persistence.read, session_id, from_seq)
                records.extend(r for r in persisted if r.seq < base)
            start = max(from_seq, base)
            records.extend(
                LogRecord(seq=base + i, event=e) for i, e in enumerate(tail) if base + i >= start
            )
            return records
        if self.persistence is None:
            raise SubagentError(f"no session {session_id}", code=ErrorCode.SESSION_NOT_FOUND)
        result: list[LogRecord] = self._call(self.persistence.read, session_id, from_seq)
        return result

    def _call(self, fn: Any, *args: Any) -> Any:
        if self.persistence is not None and self.persistence.blocking:
            return self._backend.run_blocking(fn, *args)
        return fn(*args)

    # -- durability ----------------------------------------------------------------

    def flush(self, session_id: SessionId | None = None, timeout: float | None = 30.0) -> None:
        """Wait until every write submitted so far is committed to persistence.

        Raises:
            SubagentError: the write failure of ``session_id``, or ``TIMEOUT``.
        """
        if self._writer is None:
            return
        # A live session waits only for its own writes: settling thousands of
        # children at once (a drain) must not make each wait for all the others.
        live = self._live.get(session_id) if session_id is not None else None
        if self._writer.inline:  # deferred events are written now
            with self._lock:
                pending = [live] if live is not None else list(self._live.values())
            for one in pending:
                one._write_pending(self._writer)
        ticket = live.last_ticket if live is not None else self._writer.ticket
        if not self._writer.wait(ticket, timeout):
            raise SubagentError("flush timed out", code=ErrorCode.TIMEOUT)
        if session_id is not None:
            failure = self._writer.take_failure(session_id)
            if failure is not None:
                raise SubagentError(
                    f"session {session_id} did not reach persistence: {failure}",
                    code=ErrorCode.INTERNAL,
                ) from failure

    def close(self) -> None:
        """Stop the writer after it drained; idempotent."""
        if self._writer is not None:
            self._writer.close()
