"""The store contract: :class:`SessionStore` and :class:`LogRecord`.

A session is a header (its durable identity) plus an append-only log of events
numbered by ``seq`` from 0, gapless and monotone, plus at most one checkpoint (an
opaque folded-state blob valid through some ``seq``). Stores know nothing about
what events mean: folding, projections and residency belong to the layers above.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Self

from subagents.protocol import (
    CorruptRecordError,
    ErrorCode,
    Event,
    MessageId,
    SessionHeader,
    SessionId,
    SubagentError,
)

from ._durable import DurableQueues, LeaseToken, Listener, NewLease
from ._forked import inherited_error
from ._validate import check_session_ids

__all__ = ["LogRecord", "SessionStore", "not_found", "session_exists", "store_closed"]


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One event of a session's log and its position ``seq`` (0-based)."""

    seq: int
    event: Event


def store_closed(store: object) -> SubagentError:
    """The error every call on a closed store raises; ``WRONG_PROCESS`` for a store
    this process inherited at a fork (see :mod:`._forked`)."""
    pid = getattr(store, "_forked_from", None)
    if pid is not None:
        return inherited_error(type(store).__name__, pid)
    return SubagentError(f"{type(store).__name__} is closed", code=ErrorCode.STORE_CLOSED)


def not_found(session_id: SessionId) -> SubagentError:
    """``SESSION_NOT_FOUND`` for ``session_id``."""
    return SubagentError(
        f"no session {session_id}",
        code=ErrorCode.SESSION_NOT_FOUND,
        hint={"session_id": session_id},
    )


def session_exists(session_id: SessionId) -> SubagentError:
    """``SESSION_EXISTS`` for ``session_id``."""
    hint = {"session_id": session_id}
    return SubagentError(f"session {session_id} exists", code=ErrorCode.SESSION_EXISTS, hint=hint)


class SessionStore(DurableQueues):
    """Headers, append-only event logs and checkpoints of sessions.

    Every method is safe to call from many threads at once. Ids may be given as
    :class:`SessionId` or as plain ``str`` (converted; malformed ids raise
    ``INVALID_ARGUMENT``). Every deliberate failure is a :class:`SubagentError`:

    * ``SESSION_NOT_FOUND`` for an unknown session (where noted),
    * ``SESSION_EXISTS`` when creating an id that exists,
    * ``INVALID_ARGUMENT`` for arguments of the wrong type or range,
    * ``CORRUPT_RECORD`` (:class:`CorruptRecordError`) for stored bytes that fail
      to decode,
    * ``STORE_CLOSED`` for any call after :meth:`close`.

    Attributes:
        durable: whether appended events survive the process.
        blocking: whether calls do disk I/O; the gevent runtime then runs them in
            gevent's threadpool instead of on the hub.
        inline_writes: whether the runtime may write to the store from the thread
            that appends, not through its write-behind task (sparing each write a
            hand-off): for stores whose writes are cheap and never block (default
            False; :class:`MemoryStore` sets it).
        remote_clock: whether :meth:`clock` asks a server (default False).
    """

    durable: ClassVar[bool]
    blocking: ClassVar[bool]
    inline_writes: ClassVar[bool] = False
    remote_clock: ClassVar[bool] = False

    @abc.abstractmethod
    def create_session(
        self,
        header: SessionHeader,
        events: Sequence[Event] = (),
        *,
        lease: NewLease | None = None,
        inbox: Sequence[Event] = (),
    ) -> int:
        """Create a session atomically: its header, initial ``events``, and -- when
        given -- its first lease (``(holder, expires, wake)``, epoch 1) and first
        inbox messages (handed to that epoch), or nothing at all.

        Returns:
            The seq of the last initial event, ``-1`` when ``events`` is empty.

        Raises:
            SubagentError: ``SESSION_EXISTS`` when ``header.id`` exists.
        """

    def _owned_appender(self) -> Callable[[SessionId, Sequence[Event]], object]:
        """The append the runtime's inline writer calls (``inline_writes`` stores).

        Its events were built by the runtime's own trusted constructors and its id
        is a :class:`SessionId` of a session the runtime created, so a store may
        hand back a variant that skips :meth:`append`'s argument checks and its
        seq list. The default is :meth:`append` itself.
        """
        return self.append

    def _takes_turn_records(self) -> bool:
        """Whether :meth:`_owned_appender` takes a turn as its compact
        :class:`~subagents.protocol.TurnRecord` (the record in each slot it stands
        for; the store builds the events when it is read). The default is False:
        the runtime hands it the events themselves."""
        return False

    def _write_soon(self, ops: Sequence[tuple[Any, ...]], unawaited: Callable[[], bool]) -> Any:
        """:meth:`write_many` of a write-behind nobody waits for while ``unawaited()``:
        a store may hold it to share a commit with another write (default: no)."""
        return self.write_many(ops)

    def _hurry(self) -> None:
        """Somebody waits now (``unawaited()`` says so): commit what is held."""

    @abc.abstractmethod
    def append(
        self,
        session_id: SessionId | str,
        events: Sequence[Event],
        *,
        lease: LeaseToken | None = None,
        done: Sequence[MessageId] = (),
    ) -> list[int]:
        """Append ``events`` as one atomic batch and return their seqs.

        Seqs continue the session's log without gaps. A durable store returns only
        once the batch is durable. ``done`` marks inbox messages done in the same
        batch (the turn that ran them ended); ``lease`` fences it.

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``, ``LEASE_LOST``.
        """

    @abc.abstractmethod
    def read(self, session_id: SessionId | str, from_seq: int = 0) -> list[LogRecord]:
        """The records with ``seq >= from_seq``, in seq order.

        Raises:
            CorruptRecordError: at the first row that fails to decode (names the
                session and the seq).
            SubagentError: ``SESSION_NOT_FOUND``.
        """

    def read_many(
        self, session_ids: Iterable[SessionId | str]
    ) -> dict[SessionId, list[LogRecord] | CorruptRecordError]:
        """Each given session's whole log, for a reader of many sessions at once
        (``subagents tree``): a session with a row that does not decode maps to that
        row's :class:`CorruptRecordError` (as :meth:`read` raises it), and the other
        logs still read; an id that names no stored session is absent.

        The default reads the logs one by one; the SQL stores read a chunk of
        sessions per statement.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for an argument that is no list of
                session ids; a storage error of the whole read.
        """
        logs: dict[SessionId, list[LogRecord] | CorruptRecordError] = {}
        for sid in check_session_ids(session_ids):
            try:
                logs[sid] = self.read(sid)
            except CorruptRecordError as exc:
                logs[sid] = exc
            except SubagentError as exc:
                if exc.code != ErrorCode.SESSION_NOT_FOUND:
                    raise
        return logs

    @abc.abstractmethod
    def scan(
        self, session_id: SessionId | str, from_seq: int = 0
    ) -> Iterator[LogRecord | CorruptRecordError]:
        """Like :meth:`read`, lazily, yielding a bad row's error in its place.

        The unknown-session check happens at the call, not at the first ``next``.
        Iteration never raises for a bad row, so the rest of the log stays readable.
        """

    @abc.abstractmethod
    def header(self, session_id: SessionId | str) -> SessionHeader | None:
        """The session's header, ``None`` when the session does not exist.

        Raises:
            CorruptRecordError: the stored header does not decode (``seq`` -1).
        """

    @abc.abstractmethod
    def exists(self, session_id: SessionId | str) -> bool:
        """Whether the session exists."""

    @abc.abstractmethod
    def last_seq(self, session_id: SessionId | str) -> int:
        """The seq of the last event, ``-1`` for an empty log.

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``.
        """

    @abc.abstractmethod
    def raise_delegation_depth(self, session_id: SessionId | str, depth: int) -> SessionHeader:
        """Raise the persisted delegation-depth floor to ``depth`` (R-DEPTH-2).

        Stores ``max(old, depth)``: the floor only rises. Returns the header as
        stored afterwards.

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``.
        """

    @abc.abstractmethod
    def list_headers(self, parent_session: SessionId | str | None) -> list[SessionHeader]:
        """Direct children of ``parent_session`` (``None``: sessions without a parent).

        Ordered by ``(created_at, id)``. A stored header that does not decode
        raises :class:`CorruptRecordError` (``seq`` -1), as in :meth:`header`.
        """

    @abc.abstractmethod
    def all_headers(self) -> list[SessionHeader]:
        """Every session's header, ordered by ``(created_at, id)``."""

    def write_many(self, ops: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Apply several writes, in order, as one batch where the store can.

        Each op is ``("create", header, events[, lease, inbox])``, ``("append",
        session_id, events[, lease, done])``, ``("delete", session_id)``,
        ``("checkpoint", session_id, seq, data[, lease])``, ``("projection", session_id,
        unit, seq, data)`` or ``("release", session_id, token[, unrun])``. Returns, per op,
        its result or the :class:`SubagentError` it failed with: one failing op does
        not fail the others. :class:`SqliteStore` commits them in one durable
        transaction, which is what a single writer (the runtime's write-behind
        queue) needs to get group commit without concurrent callers.
        """
        out: list[Any] = []
        for op in ops:
            try:
                out.append(self._apply(op))
            except SubagentError as exc:
                out.append(exc)
        return out

    def _apply(self, op: tuple[Any, ...]) -> Any:
        kind = op[0]
        # The keywords only when used: a store written before leases and the inbox
        # (a subclass overriding the two-argument forms) keeps working without them.
        if kind == "create":
            lease, inbox = (*op[3:], None, ())[:2]
            if lease is None and not inbox:
                return self.create_session(op[1], op[2])
            return self.create_session(op[1], op[2], lease=lease, inbox=inbox)
        if kind == "append":
            token, done = (*op[3:], None, ())[:2]
            if token is None and not done:
                return self.append(op[1], op[2])
            return self.append(op[1], op[2], lease=token, done=done)
        if kind == "release":
            return self.release_lease(op[1], op[2], unrun=op[3] if len(op) > 3 else ())
        if kind == "delete":
            return self.delete_session(op[1])
        if kind == "checkpoint":
            if len(op) > 4 and op[4] is not None:
                return self.put_checkpoint(op[1], op[2], op[3], lease=op[4])
            return self.put_checkpoint(op[1], op[2], op[3])
        if kind == "projection":
            return self.put_projection(op[1], op[2], op[3], op[4])
        raise SubagentError(f"unknown write op {kind!r}", code=ErrorCode.INVALID_ARGUMENT)

    def scan_headers(self) -> list[SessionHeader | CorruptRecordError]:
        """Like :meth:`all_headers`, but a header that does not decode is returned as
        its :class:`CorruptRecordError` (seq ``-1``) in place, so one bad row does
        not hide the others."""
        return list(self.all_headers())

    def scan_children(
        self, parents: Sequence[SessionId | str]
    ) -> list[SessionHeader | CorruptRecordError]:
        """Like :meth:`scan_headers`, but only the sessions whose parent is one of
        ``parents``: ordered by ``(created_at, id)``, a header that does not decode in
        place as its :class:`CorruptRecordError` (its ``hint["parent_session"]`` the
        parent's hex id). A listing of one parent's children reads this instead of
        the whole store.

        The default filters :meth:`scan_headers`; a store with a parent index
        should override it.
        """
        wanted = check_session_ids(parents)
        if not wanted:
            return []
        hexes = {str(p) for p in wanted}
        return [
            item
            for item in self.scan_headers()
            if (
                item.parent_session in wanted
                if isinstance(item, SessionHeader)
                else (item.hint or {}).get("parent_session") in hexes
            )
        ]

    @abc.abstractmethod
    def delete_session(self, session_id: SessionId | str) -> None:
        """Remove header, events and checkpoint; no error when absent.

        Used to roll back a start that failed before publication.
        """

    @abc.abstractmethod
    def put_checkpoint(
        self,
        session_id: SessionId | str,
        seq: int,
        data: bytes,
        *,
        lease: LeaseToken | None = None,
    ) -> None:
        """Store the session's checkpoint (latest wins): ``data`` is valid through ``seq``.

        ``lease`` fences it like an append: a holder that lost the session stores
        no state folded from events it never got to write.

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``; ``INVALID_ARGUMENT`` when ``seq``
                is past the end of the log; ``LEASE_LOST`` when ``lease`` is not the
                session's lease.
        """

    @abc.abstractmethod
    def get_checkpoint(self, session_id: SessionId | str) -> tuple[int, bytes] | None:
        """``(seq, data)`` of the session's checkpoint, or ``None``."""

    @abc.abstractmethod
    def put_projection(self, session_id: SessionId | str, unit: str, seq: int, data: bytes) -> None:
        """Cache a projection ``unit``'s value of a session, folded at log position ``seq``.

        Derived data: latest wins, dropped with the session or by
        :meth:`drop_projections`. ``SESSION_NOT_FOUND`` for an unknown session.
        """

    @abc.abstractmethod
    def get_projection(self, session_id: SessionId | str, unit: str) -> tuple[int, bytes] | None:
        """``(seq, data)`` of a cached projection, or ``None``."""

    @abc.abstractmethod
    def get_projections(self, unit: str) -> dict[SessionId, tuple[int, bytes]]:
        """Every cached ``(seq, data)`` of ``unit``, by session (one read for a listing)."""

    def get_projections_of(
        self, unit: str, sessions: Iterable[SessionId | str]
    ) -> dict[SessionId, tuple[int, bytes]]:
        """The cached ``(seq, data)`` of ``unit`` for each of ``sessions`` that has one
        (one read for a listing of one parent's children, whatever the store's size).

        The default filters :meth:`get_projections`; a store with an index on the
        session should override it.
        """
        wanted = check_session_ids(sessions)
        if not wanted:
            return {}
        return {sid: row for sid, row in self.get_projections(unit).items() if sid in wanted}

    @abc.abstractmethod
    def drop_projections(self) -> None:
        """Forget every cached projection (they are rebuilt from the logs)."""

    def clock(self) -> float:
        """The clock leases are measured by (their ``now`` and ``expires``, wall-clock
        seconds), one that every process sharing the store reads: this default is
        this host's (every process on an SQLite file runs on it); a server store's
        is the server's (``remote_clock``: a round trip), so hosts agree on expiries
        whatever their own clocks say."""
        return time.time()

    def listen(self) -> Listener | None:
        """A wake-up channel of this process's own that other processes reach through
        the store (:meth:`notify`), or None when the store has none (the runtime then
        uses its host's doorbell). A runtime records its ``address`` in its leases."""
        return None

    def notify(self, address: str, payload: bytes) -> bool:
        """Ring the :meth:`listen` channel at ``address`` with ``payload`` (a hint,
        at most 1024 bytes); False when ``address`` is not one of this store's.

        Raises:
            SubagentError: the store failed (the caller treats a ring as a hint).
        """
        return False

    @abc.abstractmethod
    def flush(self, session_id: SessionId | str | None = None) -> None:
        """Make everything appended so far durable (a no-op where append already is)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release every resource. Idempotent; later calls raise ``STORE_CLOSED``."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
