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
from collections.abc import Callable, Sequence
from typing import Any

from subagents.actors._kernel._backend import Backend
from subagents.actors._kernel._checks import check_timeout
from subagents.protocol import (
    ErrorCode,
    Event,
    MessageId,
    SessionHeader,
    SessionId,
    SubagentError,
    pack_shaped,
    packb,
)
from subagents.store import Release, SessionStore

from ._acceptance import Acceptance
from ._appends import Appends
from ._failures import PersistenceFailures, SessionStatistics
from ._leases import Leases
from ._live import LiveSession
from ._reading import SessionReads
from ._rung import Rung
from ._sweep_reads import SweepReads
from ._write_faults import unsure
from ._writer import Writer

__all__ = ["LiveSession", "SessionService"]

logger = logging.getLogger("subagents")


class SessionService(Acceptance, Appends, SessionReads, SweepReads):
    """Live sessions of live agents, and write-behind to optional persistence.

    Thread-safe. ``persistence`` is ``None`` for a runtime without a store.
    """

    def __init__(
        self,
        persistence: SessionStore | None,
        backend: Backend,
        *,
        leases: Leases | None = None,
        lost: Callable[[SessionId], object] | None = None,
        strict: bool = False,
    ) -> None:
        self.persistence = persistence
        self.leases = leases
        #: Accepted means committed: every message a session accepts is in its
        #: durable inbox before the acceptance returns, and leaves it with the end
        #: of the turn that ran it.
        self.strict = strict and persistence is not None
        self._lost = lost
        self._backend = backend
        self._live: dict[SessionId, LiveSession] = {}
        self._lock = threading.Lock()
        self._init_acceptance()
        #: Sessions whose writes stopped at a failure (see ``_failures``).
        self.failures = PersistenceFailures()
        #: Called with a session this runtime released while messages nobody took
        #: were waiting in its inbox (the runtime sees that they run).
        self.on_waiting: Callable[[SessionId], object] | None = None
        #: The rings of that pickup not answered yet (``Runtime.wait_idle`` waits).
        self.rung = Rung()
        callbacks = (self._committed, self._failed, self.wake_pickup, self._release_later)
        self._writer = Writer(persistence, backend, *callbacks) if persistence is not None else None

    # -- lifecycle of live sessions -------------------------------------------------

    def open(
        self,
        header: SessionHeader,
        events: Sequence[Event] = (),
        *,
        inbox: Sequence[Event] = (),
        now: bool | None = None,
    ) -> LiveSession:
        """Create a new session, live and persisted: write-behind, or committed before
        this returns with ``now=True`` (the default under strict durability). With
        leases it is created holding its first lease, and ``inbox`` messages are
        accepted with it, in the same write.

        Raises:
            SubagentError: ``SESSION_EXISTS`` when the id is live or persisted.
        """
        leases = self.leases
        lease = leases.new(header.id) if leases is not None else None
        live = LiveSession(header, 0, None if lease is None else (lease[0], 1))
        with self._lock:
            if header.id in self._live:
                if lease is not None and leases is not None:
                    leases.forget(header.id, 1)
                raise SubagentError(f"session {header.id} exists", code=ErrorCode.SESSION_EXISTS)
            self._live[header.id] = live
        live._append(events)
        writer = self._writer
        store = self.persistence
        if writer is not None and store is not None:
            create = (header, list(events), lease, list(inbox))
            if self.strict if now is None else now:
                try:
                    self._call(store.create_session, header, events, lease=lease, inbox=inbox)
                except BaseException as exc:
                    self._drop(live)
                    if lease is not None and leases is not None:
                        # Lost at its commit (created all the same?): let it go, inbox given back.
                        if unsure(exc):
                            unrun = [e.message_id for e in inbox]  # type: ignore[attr-defined]
                            self.give_up(header.id, (lease[0], 1), unrun)
                        else:
                            leases.forget(header.id, 1)
                    raise
                self._stored(live)
            else:
                live.last_ticket = writer.submit("create", header.id, create)
                if writer.inline and writer.take_failure(header.id) is None:
                    self._stored(live)
        return live

    @staticmethod
    def _stored(live: LiveSession) -> None:
        with live._lock:  # created with its initial events: nothing pending
            live.events.clear()
            live.base_seq = live.written = live.next_seq

    def attach(
        self, header: SessionHeader, next_seq: int, token: tuple[str, int] | None = None
    ) -> LiveSession:
        """Make a persisted session live again (cold resume), under ``token`` (the lease
        the caller acquired); its log stays in persistence."""
        live = LiveSession(header, next_seq, token)
        with self._lock:
            if header.id in self._live:
                raise SubagentError(
                    f"session {header.id} is already live", code=ErrorCode.SESSION_EXISTS
                )
            self._live[header.id] = live
        reset = self._activated(header.id)
        if reset is not None:  # its flush waits for the earlier failure to be history
            live.last_ticket = reset
        return live

    def wake_pickup(self, sid: SessionId) -> None:
        """Have this runtime's own mail pickup look at ``sid`` (what waits in its
        inbox); owed in :attr:`rung` until it did."""
        if self.on_waiting is not None:
            self.rung.ring(sid)
            self.on_waiting(sid)

    def _failed(self, sid: SessionId, error: BaseException) -> None:
        """A write of ``sid`` failed: a lost lease means another holder took it over;
        any other failure is recorded (``statistics()``) and stops the session's
        agent too (as Akka stops a persistent actor whose write failed): the store
        is the truth, and the next activation starts from it (under strict
        durability replaying what was accepted and not done)."""
        self.failures.record(sid, error)  # (a lost lease's is kept, not counted)
        if self._lost is not None:
            self._lost(sid)

    def statistics(self) -> SessionStatistics:
        """Live sessions, persistence failures, and the store's own counters."""
        self.check_process()
        stats = getattr(self.persistence, "statistics", None)
        return SessionStatistics(
            live_sessions=len(self._live),
            failed_writes=self.failures.count,
            persistence_failures=self.failures.snapshot(),
            store=stats() if callable(stats) else None,
        )

    def _activated(self, session_id: SessionId) -> int | None:
        """A new activation starts from the store: an earlier failure is history
        (the ticket of the writer's reset, when it had one)."""
        self.failures.forget(session_id)
        return self._writer.reset(session_id) if self._writer is not None else None

    def checkpoint(self, live: LiveSession, state: dict[str, Any], *, shaped: bool = False) -> None:
        """Queue a checkpoint of folded ``state`` valid through the live log's last seq.

        Cold resume reads it instead of refolding the whole log, so its cost does
        not grow with the log. ``shaped=True``: the caller built ``state`` from
        values of known, shallow nesting, so the nesting check is skipped (every
        settle writes one; the check was a tenth of a drain's time).
        """
        writer = self._writer
        if writer is None:
            return
        try:
            live._checkpoint(writer, state, pack_shaped if shaped else packb)
        finally:
            if writer.inline:  # a failure: the agent stops, with the session's lock released
                writer.report()

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

    def _committed(self, sid: SessionId, seq: int) -> None:
        live = self._live.get(sid)
        if live is not None:
            live._trim_through(seq)

    def release(self, live: LiveSession, *, lease: bool = True) -> None:
        """Drop a session from the live set (its agent left residency), and give its
        lease up with its last write (``lease=False``: it was lost, or is deleted)."""
        self._drop(live)
        token, writer = live.token, self._writer
        if token is not None and self.leases is not None:
            self.leases.forget(live.id, token[1])
            if lease and writer is not None and writer.take_failure(live.id) is not None:
                # Its writes stopped at a failure: the lease goes back directly,
                # so its next activation (anywhere) replays what it accepted.
                self.give_up(live.id, token)
            elif lease and writer is not None:
                live.last_ticket = writer.submit("release", live.id, (token, live.unrun or ()))
        if writer is not None:
            writer.ended(live.id)  # (its failure stays in ``failures``: see flush)

    def give_up(
        self, session_id: SessionId, token: tuple[str, int], unrun: Sequence[MessageId] = ()
    ) -> None:
        """Release a lease taken for a session that never became live (``unrun``: given back)."""
        store = self.persistence
        if self.leases is not None:
            self.leases.forget(session_id, token[1])
        if store is not None:
            try:
                released = self._call(store.release_lease, session_id, token, unrun=unrun)
            except SubagentError as exc:
                logger.warning("releasing the lease of %s failed (retried): %s", session_id, exc)
                self._release_later(session_id, token, unrun)
            else:
                self._released(session_id, released)

    def _release_later(
        self, session_id: SessionId, token: tuple[str, int], unrun: Sequence[MessageId]
    ) -> None:
        """A release that did not land -- refused, or (the writer's) its batch or an
        earlier write of the session failed: retried every renewal period until
        written, else the lease stays this holder's, live by its heartbeat."""
        if self.leases is not None:
            self.leases.release_later(
                session_id, token, lambda r: self._released(session_id, r), unrun
            )

    def written(self, live: LiveSession, timeout: float | None = 30.0) -> bool:
        """Wait for ``live``'s writes so far; a failure stays for its release (not flush)."""
        return self._writer is None or self._writer.wait(live.last_ticket, timeout)

    def _released(self, session_id: SessionId, result: Release) -> None:
        if result == Release.WAITING:
            self.wake_pickup(session_id)

    def _drop(self, live: LiveSession) -> None:
        with self._lock:
            if self._live.get(live.id) is live:
                del self._live[live.id]
            live.released = True

    def discard(self, live: LiveSession, timeout: float | None = 30.0) -> None:
        """Roll a session back: out of the live set and deleted from persistence."""
        self.release(live, lease=False)
        if self._writer is not None:
            ticket = self._writer.submit("delete", live.id, None)
            self._writer.wait(ticket, timeout)
            self._writer.forget(live.id)

    # -- reading -------------------------------------------------------------------

    def live(self, session_id: SessionId) -> LiveSession | None:
        """The live session of ``session_id`` in this runtime, or ``None``."""
        return self._live.get(session_id)

    def live_ids(self) -> list[SessionId]:
        """The ids of every session live in this runtime."""
        with self._lock:
            return list(self._live)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.persistence is not None and self.persistence.blocking:
            return self._backend.run_blocking(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    # -- durability ----------------------------------------------------------------

    def flush(self, session_id: SessionId | None = None, timeout: float | None = 30.0) -> None:
        """Wait until every write submitted so far is committed to persistence.

        Raises:
            SubagentError: the write failure of ``session_id``, ``TIMEOUT``, or
                ``INVALID_ARGUMENT`` (a bad id or timeout).
        """
        self.check_process()
        if session_id is not None:
            session_id = SessionId(session_id)
        timeout = check_timeout(timeout)
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
            if failure is not None:  # its own code: an outage is no bug of ours
                code = failure.code if isinstance(failure, SubagentError) else ErrorCode.INTERNAL
                raise SubagentError(
                    f"session {session_id} did not reach persistence: {failure}", code=code
                ) from failure
            if (failed := self.failures.unwritten(session_id)) is not None:
                raise failed  # (an activation that ended at it: its writer forgot it)

    def close(self) -> None:
        """Stop the writer after it drained, and the lease renewals; idempotent.
        Without persistence, reads of a session then raise ``STORE_CLOSED``: its
        sessions ended with the runtime."""
        self.closed = True
        if self._writer is not None:
            self._writer.close()
        if self.leases is not None:
            self.leases.close()
