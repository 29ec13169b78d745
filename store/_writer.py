"""The write side of :class:`SqliteStore`: one connection, one transaction per batch.

:class:`Writer` owns the store's only write connection and is driven by the
group-commit leader (one thread at a time). A batch is written in one ``BEGIN
IMMEDIATE ... COMMIT``. Each request's operation (a method of :class:`Txn`)
checks before it writes: a request that fails a check (unknown session, id
exists, seq out of range) raises :class:`SubagentError` having written nothing,
and the rest of the batch commits. Anything else that fails rolls the batch back
and every request is retried in a transaction of its own, so only the faulty one
fails (``PERSISTENCE_UNAVAILABLE``). The exception is a write lock that stayed
busy past ``busy_timeout``: the whole batch fails once with ``TIMEOUT`` rather
than waiting again for every request.

Seqs are assigned inside the transaction from a per-session next-seq cache. The
cache is only trusted while no other connection has committed: ``PRAGMA
data_version`` is read after taking the write lock, and a change (another
process, or another store on the same file) drops the cache. As a second line, a
primary-key conflict on insert drops the cache and the batch is retried (per
request), re-reading ``max(seq)``: seqs never repeat or skip.
"""

from __future__ import annotations

import datetime as _dt
import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from itertools import repeat
from typing import Final

from subagents.protocol import (
    CorruptRecordError,
    DecodeError,
    ErrorCode,
    SessionHeader,
    SessionId,
    SubagentError,
    decode_header,
    encode_header,
    micros,
)

from ._base import not_found, session_exists
from ._cells import STORED_VALUE_ERRORS, blob, stored_value_error
from ._durable import LeaseToken, NewLease
from ._group import WriteRequest
from ._queue_txn import ANSWERED, INBOX_KEY, AcceptOp, Message, QueueTxn, SqlConn
from ._schema import database_corrupt, is_corrupt
from ._validate import invalid

__all__ = [
    "NEXT_SEQ",
    "Txn",
    "Writer",
    "apply_batch",
    "decode_header_row",
    "finish_batch",
    "storage_error",
]

_EPOCH: Final = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
#: Forget cached next-seqs beyond this many sessions (a bound, not a tuning knob).
_CACHE_LIMIT: Final = 65_536

_INSERT_EVENT: Final = "INSERT INTO events (session, seq, body) VALUES (?, ?, ?)"
#: ``(session exists, max(seq))`` of one session, in one statement (one snapshot).
NEXT_SEQ: Final = (
    "SELECT EXISTS (SELECT 1 FROM sessions WHERE id = ?1),"
    " (SELECT max(seq) FROM events WHERE session = ?1)"
)


#: Most decoded headers one store keeps (see ``decode_header_row``).
HEADER_CACHE_MAX = 131_072


def decode_header_row(
    session_id: SessionId,
    stored: bytes,
    cache: dict[bytes, SessionHeader] | None = None,
    remember: bool = True,
) -> SessionHeader:
    """Decode a stored header; a bad one is a :class:`CorruptRecordError` with seq -1.

    ``cache`` maps exact stored bytes to decoded headers: a header is immutable but
    for its depth floor (whose change changes the bytes), so equal bytes are the
    same header, and a warm listing of a big tree skips the validating decoder.
    ``remember=False`` only reads the cache (a single header's read: a server
    reading one header per request must not grow it with every new session).
    """
    key = blob(stored, session_id, "header")
    if cache is not None:
        cached = cache.get(key)
        if cached is not None and cached.id == session_id:
            return cached
    try:
        header = decode_header(key)
        if cache is not None and remember:
            if len(cache) >= HEADER_CACHE_MAX:
                cache.clear()
            cache[key] = header
        return header
    except DecodeError as exc:
        raise CorruptRecordError(
            f"session {session_id}: stored header does not decode: {exc}",
            session_id=session_id,
            seq=-1,
        ) from exc


class Txn(QueueTxn):
    """The operations a write request applies, inside the batch's transaction.

    ``overlay`` holds next-seqs changed by this transaction (``None``: the session
    no longer exists); it reaches the shared cache only after ``COMMIT``.
    """

    __slots__ = ("_cache", "_fenced", "conn", "events", "overlay", "released")

    def __init__(
        self,
        conn: SqlConn,
        cache: dict[bytes, int],
        fenced: dict[bytes, LeaseToken] | None = None,
    ) -> None:
        self.conn = conn
        self._cache = cache
        self.overlay: dict[bytes, int | None] = {}
        self.released: list[bytes] = []  # sessions whose lease this transaction released
        self.events = 0
        # Lease checks made (see QueueTxn.fence): this transaction's, or the writer's
        # while nobody else committed (the same rule as the next-seq cache).
        self._fenced: dict[bytes, LeaseToken] = {} if fenced is None else fenced

    def _next_seq(self, key: bytes, session_id: SessionId) -> int:
        if key in self.overlay:
            nxt = self.overlay[key]
        else:
            nxt = self._cache.get(key)
            if nxt is None:
                exists, last = self.conn.execute(NEXT_SEQ, (key,)).fetchone()
                nxt = (-1 if last is None else last) + 1 if exists else None
        if nxt is None:
            raise not_found(session_id)
        return nxt

    def _insert(self, key: bytes, start: int, bodies: Sequence[bytes]) -> None:
        if len(bodies) == 1:
            self.conn.execute(_INSERT_EVENT, (key, start, bodies[0]))
        else:
            # zip() builds the rows in C: ~0.3 us/row less than a comprehension.
            rows = zip(repeat(key), range(start, start + len(bodies)), bodies)
            self.conn.executemany(_INSERT_EVENT, rows)
        self.overlay[key] = start + len(bodies)
        self.events += len(bodies)

    def append(
        self,
        session_id: SessionId,
        bodies: Sequence[bytes],
        token: LeaseToken | None = None,
        done: Sequence[bytes] = (),
    ) -> list[int]:
        key = session_id.to_bytes()
        start = self._next_seq(key, session_id)
        if token is not None or done:
            self.complete(session_id, done, token)  # fences, then marks the turn's messages
        self._insert(key, start, bodies)
        return list(range(start, start + len(bodies)))

    def create(
        self,
        header: SessionHeader,
        blob: bytes,
        bodies: Sequence[bytes],
        lease: NewLease | None = None,
        inbox: Sequence[Message] = (),
    ) -> int:
        key = header.id.to_bytes()
        known = self.overlay.get(key, self._cache.get(key)) is not None
        if known or self.conn.execute("SELECT 1 FROM sessions WHERE id = ?", (key,)).fetchone():
            raise session_exists(header.id)
        parent = None if header.parent_session is None else header.parent_session.to_bytes()
        self.conn.execute(
            "INSERT INTO sessions (id, parent, origin, depth, created_at, header)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (key, parent, header.origin, header.delegation_depth, created_micros(header), blob),
        )
        self._insert(key, 0, bodies)
        epoch = None
        if lease is not None:
            self.new_lease(header.id, *lease)
            epoch = 1
        if inbox:
            self.accept_messages(header.id, inbox, epoch, 0.0, None)
        return len(bodies) - 1

    def answer(self, session_id: SessionId, message_id: bytes) -> bool:
        key = session_id.to_bytes()
        if self.conn.execute(ANSWERED, (key, message_id)).rowcount:
            return True
        if not self.conn.execute("SELECT 1 FROM sessions WHERE id = ?", (key,)).fetchone():
            raise not_found(session_id)
        return False

    def withdraw(self, session_id: SessionId, message_id: bytes) -> bool:
        # The creation's entries are dated 0.0 (see create): an answer moved it on.
        if not self.conn.execute(
            "DELETE FROM inbox WHERE session = ? AND message_id = ? AND done = 0"
            " AND epoch IS NULL AND accepted_at = 0",
            (session_id.to_bytes(), message_id),
        ).rowcount:
            return False
        self.delete(session_id)
        return True

    def delete(self, session_id: SessionId) -> None:
        key = session_id.to_bytes()
        for table, column in (
            ("events", "session"),
            ("checkpoints", "session"),
            ("projection_cache", "session"),
            ("inbox", "session"),
            ("leases", "session"),
            ("promises", "session"),
            ("sessions", "id"),
        ):
            self.conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (key,))
        self.overlay[key] = None
        self.overlay[b"n" + key] = None  # the inbox's last n (see _queue_txn)
        self._moved(key)

    def raise_depth(self, session_id: SessionId, depth: int) -> SessionHeader:
        key = session_id.to_bytes()
        row = self.conn.execute("SELECT header FROM sessions WHERE id = ?", (key,)).fetchone()
        if row is None:
            raise not_found(session_id)
        header = decode_header_row(session_id, row[0])
        if depth > header.delegation_depth:
            header = replace(header, delegation_depth=depth)
            self.conn.execute(
                "UPDATE sessions SET depth = ?, header = ? WHERE id = ?",
                (depth, encode_header(header), key),
            )
        return header

    def put_projection(self, session_id: SessionId, unit: str, seq: int, data: bytes) -> None:
        key = session_id.to_bytes()
        self._next_seq(key, session_id)  # SESSION_NOT_FOUND for an unknown session
        self.conn.execute(
            "INSERT INTO projection_cache (session, unit, seq, data) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (session, unit) DO UPDATE SET seq = excluded.seq, data = excluded.data",
            (key, unit, seq, data),
        )

    def drop_projections(self) -> None:
        self.conn.execute("DELETE FROM projection_cache")

    def put_checkpoint(
        self, session_id: SessionId, seq: int, data: bytes, token: LeaseToken | None = None
    ) -> None:
        key = session_id.to_bytes()
        nxt = self._next_seq(key, session_id)
        self.fence(session_id, token)
        if seq >= nxt:
            raise invalid(
                f"checkpoint seq {seq} is past the last seq {nxt - 1}",
                session_id=session_id,
                seq=seq,
            )
        self.conn.execute(
            "INSERT INTO checkpoints (session, seq, data) VALUES (?, ?, ?)"
            " ON CONFLICT (session) DO UPDATE SET seq = excluded.seq, data = excluded.data",
            (key, seq, data),
        )


def created_micros(header: SessionHeader) -> int:
    """``created_at`` as integer microseconds since the epoch (exact ordering)."""
    return micros(header.created_at - _EPOCH)


class Writer:
    """Applies batches of write requests through one connection.

    Only the group-commit leader calls :meth:`execute`, so the connection and the
    cache are used by one thread at a time.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._cache: dict[bytes, int] = {}
        # Leases this writer checked or wrote, valid while no other connection has
        # committed (PRAGMA data_version unchanged): a holder's acceptances then
        # skip the lease read. Any change of a lease row here drops its entry.
        self._fences: dict[bytes, LeaseToken] = {}
        self._data_version = -1
        self.transactions = 0
        self.requests = 0
        self.events = 0
        self.largest_batch = 0

    def execute(self, batch: list[WriteRequest]) -> None:
        """Write ``batch`` in one transaction; isolate failures (see module doc)."""
        self.requests += len(batch)
        self.largest_batch = max(self.largest_batch, len(batch))
        try:
            self._transaction(batch)
            return
        except (sqlite3.IntegrityError, *STORED_VALUE_ERRORS):
            # Another writer took seqs we had cached (the cache is now dropped), or
            # one request broke a constraint or met a damaged value of its own
            # session: retry each request on its own.
            pass
        except sqlite3.Error as exc:
            if len(batch) == 1 or _is_busy(exc):
                # Retrying would wait for the lock again, once per request.
                for request in batch:
                    request.finish(error=storage_error(exc))
                return
        for request in batch:
            try:
                self._transaction([request])
            except sqlite3.Error as exc:
                request.finish(error=storage_error(exc))
            except STORED_VALUE_ERRORS as exc:
                request.finish(error=stored_value_error(exc))

    def _transaction(self, batch: list[WriteRequest]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        txn = Txn(conn, self._cache, self._fences)
        try:
            data_version = conn.execute("PRAGMA data_version").fetchone()[0]
            if data_version != self._data_version:
                self._cache.clear()  # someone else committed since our last transaction
                self._fences.clear()
                self._data_version = data_version
            outcomes = apply_batch(txn, batch)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._cache.clear()
            self._fences.clear()
            raise
        self.transactions += 1
        self.events += txn.events
        cache = self._cache
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        if len(self._fences) > _CACHE_LIMIT:
            self._fences.clear()
        for key, nxt in txn.overlay.items():
            if nxt is None:
                cache.pop(key, None)
            else:
                cache[key] = nxt
        for key in txn.released:
            cache.pop(key, None)
            cache.pop(INBOX_KEY + key, None)
        finish_batch(batch, outcomes)


Outcome = tuple[object, BaseException | None]


def apply_batch(txn: Txn, batch: list[WriteRequest]) -> list[Outcome]:
    """Apply every request's op to ``txn`` in order: ``(result, error)`` per request.

    A failed check (a :class:`SubagentError`) fails its own request, having written
    nothing; anything else propagates (the caller rolls the batch back). A run of
    acceptances for one session and lease is written in one statement.
    """
    outcomes: list[Outcome] = []
    i = 0
    while i < len(batch):
        op = batch[i].op
        j = i + 1
        run: list[AcceptOp] = []
        if isinstance(op, AcceptOp):
            # Acceptances for one session and lease, queued together: one insert.
            run.append(op)
            while j < len(batch):
                following = batch[j].op
                if not (isinstance(following, AcceptOp) and op.joins(following)):
                    break
                run.append(following)
                j += 1
        try:
            if len(run) > 1:
                outcomes.extend((result, None) for result in txn.accept_many(run))
            else:
                outcomes.append((op(txn), None))
        except SubagentError as exc:  # a check failed; nothing was written
            outcomes.extend((None, exc) for _ in range(j - i))
        i = j
    return outcomes


def finish_batch(batch: list[WriteRequest], outcomes: list[Outcome]) -> None:
    """Hand each request its outcome (after the batch committed)."""
    for request, (result, error) in zip(batch, outcomes):
        request.finish(result, error)


def _is_busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def storage_error(exc: sqlite3.Error, path: str | None = None) -> SubagentError:
    """An SQLite failure as a :class:`SubagentError`.

    ``TIMEOUT`` when the database stayed locked past ``busy_timeout``,
    ``DATABASE_CORRUPT`` when SQLite finds the file damaged, else
    ``PERSISTENCE_UNAVAILABLE`` (I/O error, disk full...).
    """
    if is_corrupt(exc):
        return database_corrupt(path, exc)
    if _is_busy(exc):
        err = SubagentError(
            f"session store timed out waiting for the database lock: {exc}",
            code=ErrorCode.TIMEOUT,
        )
    else:
        err = SubagentError(f"session store failed: {exc}", code=ErrorCode.PERSISTENCE_UNAVAILABLE)
    err.__cause__ = exc
    return err
