"""The write side of :class:`~._postgres.PostgresStore`: one connection, one
transaction per batch, row locks for what SQLite's single write lock gave.

:class:`PgWriter` is driven by the group-commit leader like SQLite's ``Writer``
and applies a batch with the same operations (``_writer.apply_batch`` over a
:class:`PgTxn`), in one ``BEGIN ... COMMIT``. What differs is concurrency: many
processes on many hosts write at once, and PostgreSQL has no database-wide
write lock, so

* a write to a session's log or inbox first locks the session's row (``SELECT
  ... FOR UPDATE``) and reads ``max(seq)`` / ``max(n)`` afterwards, in a new
  statement (a new snapshot under READ COMMITTED): seqs and inbox places never
  repeat or skip, and no next-seq cache is kept across transactions (another
  process may have appended since);
* a fenced write reads the lease ``FOR SHARE``: an acquisition (which locks the
  session, then updates the lease) waits for it, so the loser of a lease never
  commits after the winner;
* lease acquisition is a compare-and-swap under the session's row lock; a
  release, a hand-over and a renewal are single-row conditional updates.

Failures: a check that fails fails its own request (writing nothing); a key
conflict or a deadlock between processes rolls the batch back and retries each
request alone; a lost connection fails the batch with
``PERSISTENCE_UNAVAILABLE`` -- it is not retried, since its commit may have
happened -- and the next batch reconnects.

A server that did not answer -- a statement cut by the deadline, a connect that
timed out -- opens a circuit breaker: for :data:`PROBE_BACKOFF` seconds batches
fail ``PERSISTENCE_UNAVAILABLE`` at once, naming the cause, rather than each
waiting ``connect_timeout_s`` again (``Runtime.close()`` writes one batch per
resident agent: on a hung server it took agents x connect timeout); the first
batch after it connects again, as a probe (one at a time: batches are serial).
A refused connect (a server down or restarting) fails as fast as the server
refuses it and opens nothing, so a call made once it is back succeeds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import psycopg
import psycopg.errors
from psycopg.pq import TransactionStatus
from subagents.protocol import ErrorCode, SessionHeader, SessionId, SubagentError

from ._base import not_found
from ._cells import STORED_VALUE_ERRORS, stored_value_error
from ._durable import Lease, LeaseToken, Release, lease_lost
from ._group import WriteRequest
from ._pg_deadline import deadline_passed
from ._pg_schema import pg_error, reorder, translate
from ._writer import Txn, apply_batch, finish_batch

__all__ = ["PgConn", "PgTxn", "PgWriter"]

_LOCK_SESSION: Final = "SELECT 1 FROM sessions WHERE id = ? FOR UPDATE"
#: What an acceptance reads once it holds the session's row lock, in one statement:
#: its inbox's last n and its lease. A statement of its own, after the lock's: under
#: READ COMMITTED each statement reads a new snapshot, so one that waited for the
#: lock sees what the holder before it committed (subqueries of the locking
#: statement itself would read the snapshot taken before the wait).
_ACCEPTING: Final = (
    "SELECT (SELECT max(n) FROM inbox WHERE session = ?1),"
    " (SELECT holder FROM leases WHERE session = ?1),"
    " (SELECT epoch FROM leases WHERE session = ?1)"
)
_MAX_SEQ: Final = "SELECT max(seq) FROM events WHERE session = ?"
#: The heartbeat row of a session's current holder, read FOR SHARE by a takeover
#: before it judges the lease's expiry (see PgTxn.acquire).
_LOCK_HOLDER: Final = (
    "SELECT 1 FROM leases l JOIN holders h ON h.holder = l.holder"
    " WHERE l.session = ? FOR SHARE OF h"
)

#: How long the writer fails batches at once after the server did not answer,
#: before it tries to connect again (seconds).
PROBE_BACKOFF: Final = 1.0

#: A failed connect that took this long waited for a server that did not answer
#: (a refusal comes back in milliseconds).
_SLOW_CONNECT: Final = 0.5

#: Failures after which each request of the batch is retried alone.
_RETRY: Final = (
    psycopg.errors.IntegrityError,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
)


class PgConn:
    """A psycopg connection speaking the ``?`` SQL of the shared operations."""

    __slots__ = ("raw",)

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> psycopg.Cursor[Any]:
        text, order = translate(sql)
        return self.raw.execute(text, reorder(order, params), binary=True)

    def executemany(self, sql: str, rows: Any, /) -> psycopg.Cursor[Any]:
        text, order = translate(sql)
        cursor = self.raw.cursor(binary=True)
        cursor.executemany(
            text,
            rows if order is None else [reorder(order, r) for r in rows],
        )
        return cursor

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != TransactionStatus.IDLE


class PgTxn(Txn):
    """The shared operations with PostgreSQL's row locks (see the module docstring)."""

    __slots__ = ("_locked",)
    FENCE = "SELECT holder, epoch FROM leases WHERE session = ? FOR SHARE"

    def __init__(self, conn: Any, cache: dict[bytes, int]) -> None:
        super().__init__(conn, cache)
        self._locked: set[bytes] = set()  # sessions whose row this transaction locked

    def _next_seq(self, key: bytes, session_id: SessionId) -> int:
        if key in self.overlay:  # read earlier in this transaction
            nxt = self.overlay[key]
            if nxt is None:
                raise not_found(session_id)
            return nxt
        self._lock(key, session_id)
        last = self.conn.execute(_MAX_SEQ, (key,)).fetchone()[0]
        nxt = 0 if last is None else int(last) + 1
        self.overlay[key] = nxt
        return nxt

    def _accepting(self, key: bytes, session_id: SessionId, token: LeaseToken | None) -> int:
        if key in self._locked:  # earlier in this transaction
            if self.overlay.get(key, 0) is None:
                raise not_found(session_id)
            self.fence(session_id, token)
            return self._last_n(key)
        self._lock(key, session_id)
        last, holder, epoch = self.conn.execute(_ACCEPTING, (key,)).fetchone()
        # The lease is read under the session's row lock, which every acquisition
        # and release takes first: it cannot change before this transaction ends.
        if token is not None:
            if holder != token[0] or epoch != token[1]:
                raise lease_lost(session_id, token)
            self._fenced[key] = token
        n = 0 if last is None else int(last)
        self.overlay[b"n" + key] = n
        return n

    def _lock(self, key: bytes, session_id: SessionId) -> None:
        """The session's row lock (once per transaction); SESSION_NOT_FOUND."""
        if key in self._locked:
            return
        if self.conn.execute(_LOCK_SESSION, (key,)).fetchone() is None:
            raise not_found(session_id)
        self._locked.add(key)

    def acquire(
        self,
        session_id: SessionId,
        holder: str,
        now: float,
        expires: float,
        wake: str | None,
        dead: Callable[[str], bool] | None,
    ) -> Lease:
        # Under the session's row lock (a compare-and-swap), and with the current
        # holder's heartbeat row read FOR SHARE: a renewal writing it (and then
        # listing the leases it keeps) waits for this takeover, and one committed
        # before is what the expiry is judged by -- the two are never both told
        # they hold the session, as SQLite's one write lock orders them.
        key = session_id.to_bytes()
        self._lock(key, session_id)
        self.conn.execute(_LOCK_HOLDER, (key,))
        return super().acquire(session_id, holder, now, expires, wake, dead)

    def withdraw(self, session_id: SessionId, message_id: bytes) -> bool:
        # Under the session's lock, as delete: an acceptance committed meanwhile is
        # withdrawn with the session, not left in an inbox of no session.
        if not self._row_locked(session_id):
            return False
        return super().withdraw(session_id, message_id)

    def delete(self, session_id: SessionId) -> None:
        self._row_locked(session_id)  # (see withdraw; no session: nothing to delete)
        super().delete(session_id)

    def release(
        self, session_id: SessionId, token: LeaseToken, unrun: Sequence[bytes] = ()
    ) -> Release:
        # Under the session's lock like an acquisition: a fenced acceptance holding it
        # then never commits after the lease changed hands.
        if not self._row_locked(session_id):
            return Release.NOT_HELD  # no session, so no lease
        return super().release(session_id, token, unrun)

    def _row_locked(self, session_id: SessionId) -> bool:
        """Lock the session's row, as an acquisition does (so the lease read next is
        the one committed last); False when there is no such session."""
        try:
            self._lock(session_id.to_bytes(), session_id)
        except SubagentError:
            return False
        return True

    def give_back(self, session_id: SessionId, message_ids: Sequence[bytes], epoch: int) -> int:
        # Under the session's lock like an acquisition, so the lease it reads is the
        # one committed last: a takeover whose resume already read the messages as
        # taken by ``epoch`` is seen (see DurableQueues.give_back).
        if not self._row_locked(session_id):
            return 0  # no session, so nothing to give back
        return super().give_back(session_id, message_ids, epoch)

    def retract(
        self,
        session_id: SessionId,
        message_id: bytes,
        epoch: int | None,
        accepted_at: float | None = None,
    ) -> bool:
        # (Locked as give_back is: a takeover's lease is seen.)
        if not self._row_locked(session_id):
            return False  # no session, so nothing to take back
        return super().retract(session_id, message_id, epoch, accepted_at)

    def raise_depth(self, session_id: SessionId, depth: int) -> SessionHeader:
        self._next_seq(session_id.to_bytes(), session_id)  # locks the row it rewrites
        return super().raise_depth(session_id, depth)


class PgWriter:
    """Applies batches of write requests through one connection (reconnecting)."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        unreachable: Callable[[], None] = lambda: None,
    ) -> None:
        self._connect = connect
        self._unreachable = unreachable  # told when the server could not be reached
        # When and why the server last did not answer (the breaker is open), or None.
        self._down: tuple[float, str] | None = None
        self.conn: PgConn | None = None
        self.transactions = 0
        self.requests = 0
        self.events = 0
        self.largest_batch = 0

    def _connection(self) -> PgConn:
        conn = self.conn
        if conn is None or conn.raw.closed or conn.raw.broken:
            if conn is not None:
                conn.raw.close()
                self.conn = None
            if self._down is not None and time.monotonic() < self._down[0] + PROBE_BACKOFF:
                raise self._refusal()
            start = time.monotonic()
            try:
                conn = self.conn = PgConn(self._connect())
            except psycopg.Error as exc:
                self._unreachable()
                if time.monotonic() - start >= _SLOW_CONNECT:
                    self._trip(exc)
                raise pg_error(exc) from exc
            self._down = None  # the probe connected
        return conn

    def _trip(self, exc: BaseException) -> None:
        """The server did not answer: fail batches at once for a while."""
        self._down = (time.monotonic(), str(exc))
        self._unreachable()

    def _refusal(self) -> SubagentError:
        assert self._down is not None
        since, cause = self._down
        return SubagentError(
            f"session store unavailable: the server did not answer {time.monotonic() - since:.1f}"
            f" s ago ({cause}); the writer tries it again {PROBE_BACKOFF:g} s after that",
            code=ErrorCode.PERSISTENCE_UNAVAILABLE,
            hint={"unreachable_since_s": round(time.monotonic() - since, 3)},
        )

    def execute(self, batch: list[WriteRequest]) -> None:
        """Write ``batch`` in one transaction; isolate failures (see module doc)."""
        self.requests += len(batch)
        self.largest_batch = max(self.largest_batch, len(batch))
        try:
            self._transaction(batch)
            return
        except SubagentError as exc:  # cannot connect
            for request in batch:
                request.finish(error=exc)
            return
        except (*_RETRY, *STORED_VALUE_ERRORS):
            pass  # another process raced us (or one request broke a key): one by one
        except psycopg.Error as exc:
            if deadline_passed(exc):
                self._trip(exc)
            # One request the server refused (a trigger, a check) must not fail the
            # others: alone, each meets only its own fate. A lost connection or a
            # lock timeout would meet every one of them again, once per request.
            if len(batch) == 1 or isinstance(exc, psycopg.OperationalError):
                for request in batch:
                    request.finish(error=pg_error(exc))
                return
        for request in batch:
            try:
                self._transaction([request])
            except SubagentError as exc:
                request.finish(error=exc)
            except psycopg.Error as exc:
                if deadline_passed(exc):
                    self._trip(exc)
                request.finish(error=pg_error(exc))
            except STORED_VALUE_ERRORS as exc:
                request.finish(error=stored_value_error(exc))

    def _begin(self) -> PgConn:
        """The write connection, in a new transaction. A connection the server
        dropped while it sat idle (a restart, a failover) is found out only by its
        next statement: its ``BEGIN`` fails, having written nothing, and is tried
        once more on a fresh connection -- or the first write after every restart
        failed although the server was back."""
        conn = self._connection()
        try:
            conn.execute("BEGIN")
        except psycopg.OperationalError as exc:
            conn.raw.close()
            if deadline_passed(exc):  # it hangs: another connection would too
                raise
            self.conn = None
            conn = self._connection()
            conn.execute("BEGIN")
        return conn

    def _transaction(self, batch: list[WriteRequest]) -> None:
        conn = self._begin()
        txn = PgTxn(conn, {})
        try:
            outcomes = apply_batch(txn, batch)
            conn.execute("COMMIT")
        except BaseException:
            if not conn.raw.broken and conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except psycopg.Error:
                    conn.raw.close()  # the next batch reconnects
            raise
        self.transactions += 1
        self.events += txn.events
        finish_batch(batch, outcomes)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.raw.close()
