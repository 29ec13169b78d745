"""``SqliteStore``: the embedded durable store (one SQLite file, WAL, msgpack rows).

Theory of operation:

* **Writes** go through :class:`GroupCommitter`: concurrent calls coalesce into
  one ``BEGIN IMMEDIATE ... COMMIT`` on the store's single write connection, and
  each call returns after its transaction committed (``synchronous=FULL`` by
  default, so after the WAL was fsynced). Events are encoded in the caller's
  thread, before queueing, so the leader's critical section is only SQL.
* **Reads** use a small pool of read connections, each statement its own WAL
  snapshot; a read never waits for a writer.
* **Opening** classifies the file first without writing to it
  (:func:`_schema.probe`), then migrates, then switches to WAL.
* It never decodes on the write path, never starts a thread, and never holds a
  read snapshot open across calls (:meth:`scan` reads in chunks).

Ids are stored as 16-byte blobs, not hex text: half the size in every key and
index (the events primary key repeats the session id in every row), memcmp order
equals hex-string order (so ``ORDER BY created_at, id`` matches the in-memory
store), and it is the same 16 bytes the msgpack codec puts on the wire. In the
``sqlite3`` shell, ``hex(id)`` shows the familiar form.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from subagents.protocol import (
    DEFAULT_LIMITS,
    CorruptRecordError,
    DecodeError,
    Event,
    Limits,
    SessionHeader,
    SessionId,
    SubagentError,
    decode_event,
    encode_event,
    encode_header,
)

from ._base import LogRecord, SessionStore, not_found, store_closed
from ._group import GroupCommitter
from ._native import native_lock
from ._schema import migrate, probe, unavailable
from ._validate import (
    check_blob,
    check_events,
    check_header,
    check_int,
    check_session_id,
    check_session_ids,
    check_unit,
    invalid,
)
from ._writer import HEADER_CACHE_MAX, NEXT_SEQ, Writer, decode_header_row, storage_error

__all__ = ["SqliteStore", "StoreStatistics"]

_SYNC_MODES: Final = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
_IDLE_READERS: Final = 16
_SCAN_CHUNK: Final = 512
#: Parents per ``IN (...)``: under the 999 bound variables of older SQLite builds.
_IN_CHUNK: Final = 500

_READ: Final = (
    "SELECT e.seq, e.body FROM sessions AS s"
    " LEFT JOIN events AS e ON e.session = s.id AND e.seq >= ?2"
    " WHERE s.id = ?1 ORDER BY e.seq"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStatistics:
    """Counters of a :class:`SqliteStore` since it was opened.

    ``transactions / write_requests`` shows how well group commit coalesces.
    """

    transactions: int
    write_requests: int
    events_appended: int
    largest_batch: int
    pending: int


def _corrupt(session_id: SessionId, seq: int, exc: DecodeError) -> CorruptRecordError:
    err = CorruptRecordError(
        f"session {session_id} seq {seq}: stored event does not decode: {exc}",
        session_id=session_id,
        seq=seq,
    )
    err.__cause__ = exc
    return err


class SqliteStore(SessionStore):
    """Sessions in one SQLite file; appends are durable when they return.

    Args:
        path: the database file; created and initialised when missing or empty.
        synchronous: SQLite's ``synchronous`` setting. ``"FULL"`` (default) makes
            every append durable on return; with ``"NORMAL"`` appends survive a
            process crash but not a power loss until :meth:`flush`.
        busy_timeout_s: how long a write waits for another process's lock.
        limits: decoding bounds applied to stored bytes.

    Raises:
        SubagentError: ``NOT_A_DATABASE`` (a file that is not a subagents
            database, left untouched), ``SCHEMA_TOO_NEW`` (written by a newer
            version, left untouched), ``PERSISTENCE_UNAVAILABLE`` (a directory,
            a missing parent, no permission), ``INVALID_ARGUMENT``.
    """

    durable = True
    blocking = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        busy_timeout_s: float = 30.0,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise invalid(f"path must be a str or os.PathLike, got {type(path).__name__}")
        fspath = os.fspath(path)
        if not isinstance(fspath, str) or not fspath or fspath == ":memory:":
            raise invalid(f"not a database file path: {fspath!r} (use MemoryStore for memory)")
        if not isinstance(synchronous, str) or synchronous.upper() not in _SYNC_MODES:
            raise invalid(f"synchronous must be one of {sorted(_SYNC_MODES)}, got {synchronous!r}")
        if type(busy_timeout_s) not in (int, float) or not busy_timeout_s >= 0:
            raise invalid(f"busy_timeout_s must be a number >= 0, got {busy_timeout_s!r}")
        if not isinstance(limits, Limits):
            raise invalid(f"limits must be a Limits, got {type(limits).__name__}")
        self.path: Final = fspath
        self._sync = synchronous.upper()
        self._timeout = float(busy_timeout_s)
        self._limits = limits
        self._pool_lock = native_lock()
        self._idle: list[sqlite3.Connection] = []
        # Decoded headers by stored bytes, for this store's life (see decode_header_row).
        self._header_cache: dict[bytes, SessionHeader] = {}
        # Raw id bytes -> the SessionId object of its cached header: a big listing
        # then allocates no id per row (each is a GC-tracked object, and 100,000
        # of them outlived young collections and set off full ones).
        self._id_cache: dict[bytes, SessionId] = {}
        self._closed = False

        probe(fspath)
        conn = self._connect()
        try:
            migrate(conn, fspath)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise unavailable(fspath, f"cannot switch to WAL (journal_mode is {mode!r})")
            conn.execute(f"PRAGMA synchronous = {self._sync}")
        except sqlite3.Error as exc:
            conn.close()
            raise unavailable(fspath, exc) from exc
        except BaseException:
            conn.close()
            raise
        self._writer = Writer(conn)
        self._committer = GroupCommitter(self._writer.execute, lambda: store_closed(self))

    def _connect(self) -> sqlite3.Connection:
        try:
            return sqlite3.connect(
                self.path,
                timeout=self._timeout,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # pooled; used by one thread at a time
            )
        except sqlite3.Error as exc:
            raise unavailable(self.path, exc) from exc

    # -- reads ----------------------------------------------------------------

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """Run one read statement on a pooled connection and fetch every row."""
        with self._pool_lock:
            if self._closed:
                raise store_closed(self)
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise storage_error(exc) from exc
        finally:
            with self._pool_lock:
                keep = not self._closed and len(self._idle) < _IDLE_READERS
                if keep:
                    self._idle.append(conn)
            if not keep:
                conn.close()

    def _decode(self, session_id: SessionId, seq: int, body: bytes) -> LogRecord:
        try:
            return LogRecord(seq, decode_event(body, limits=self._limits))
        except DecodeError as exc:
            raise _corrupt(session_id, seq, exc) from exc

    def read(self, session_id: SessionId | str, from_seq: int = 0) -> list[LogRecord]:
        sid = check_session_id(session_id)
        check_int(from_seq, "from_seq")
        rows = self._query(_READ, (sid.to_bytes(), from_seq))
        if not rows:
            raise not_found(sid)
        if rows[0][0] is None:  # the session exists; no event at or after from_seq
            return []
        decode = self._decode
        return [decode(sid, seq, body) for seq, body in rows]

    def scan(
        self, session_id: SessionId | str, from_seq: int = 0
    ) -> Iterator[LogRecord | CorruptRecordError]:
        sid = check_session_id(session_id)
        check_int(from_seq, "from_seq")
        if not self.exists(sid):
            raise not_found(sid)
        return self._scan(sid, from_seq)

    def _scan(self, sid: SessionId, seq: int) -> Iterator[LogRecord | CorruptRecordError]:
        key = sid.to_bytes()
        while True:
            rows = self._query(
                "SELECT seq, body FROM events WHERE session = ? AND seq >= ? ORDER BY seq LIMIT ?",
                (key, seq, _SCAN_CHUNK),
            )
            for seq, body in rows:
                try:
                    yield self._decode(sid, seq, body)
                except CorruptRecordError as exc:
                    yield exc
            if len(rows) < _SCAN_CHUNK:
                return
            seq += 1

    def header(self, session_id: SessionId | str) -> SessionHeader | None:
        sid = check_session_id(session_id)
        rows = self._query("SELECT header FROM sessions WHERE id = ?", (sid.to_bytes(),))
        return decode_header_row(sid, rows[0][0], self._header_cache) if rows else None

    def exists(self, session_id: SessionId | str) -> bool:
        sid = check_session_id(session_id)
        return bool(self._query("SELECT 1 FROM sessions WHERE id = ?", (sid.to_bytes(),)))

    def last_seq(self, session_id: SessionId | str) -> int:
        sid = check_session_id(session_id)
        exists, last = self._query(NEXT_SEQ, (sid.to_bytes(),))[0]
        if not exists:
            raise not_found(sid)
        return -1 if last is None else int(last)

    def _headers(self, where: str, params: tuple[Any, ...]) -> list[SessionHeader]:
        rows = self._query(
            f"SELECT id, header FROM sessions {where} ORDER BY created_at, id", params
        )
        return [self._decode_row(key, blob) for key, blob in rows]

    def _session_id(self, key: bytes) -> SessionId:
        """The SessionId for 16 raw id bytes of our own table (shared when known)."""
        sid = self._id_cache.get(key)
        if sid is None:
            sid = SessionId.from_bytes(key)  # type: ignore[assignment]
        return sid  # type: ignore[return-value]

    def _decode_row(self, key: bytes, blob: bytes) -> SessionHeader:
        key = bytes(key)
        header = decode_header_row(self._session_id(key), blob, self._header_cache)
        ids = self._id_cache
        if key not in ids:
            if len(ids) >= HEADER_CACHE_MAX:
                ids.clear()
            ids[key] = header.id
            parent = header.parent_session
            if parent is not None:
                # Parents are stored (and scanned) before their children: share the
                # parent header's id object instead of keeping an equal copy alive.
                shared = ids.get(parent.to_bytes())
                if shared is not None and shared is not parent:
                    object.__setattr__(header, "parent_session", shared)
        return header

    def list_headers(self, parent_session: SessionId | str | None) -> list[SessionHeader]:
        if parent_session is None:
            return self._headers("WHERE parent IS NULL", ())
        parent = check_session_id(parent_session)
        return self._headers("WHERE parent = ?", (parent.to_bytes(),))

    def all_headers(self) -> list[SessionHeader]:
        return self._headers("", ())

    def scan_headers(self) -> list[SessionHeader | CorruptRecordError]:
        rows = self._query("SELECT id, parent, header FROM sessions ORDER BY created_at, id", ())
        return self._scanned(rows)

    def _scanned(self, rows: Iterable[Any]) -> list[SessionHeader | CorruptRecordError]:
        """Decoded ``(id, parent, header)`` rows; a broken one as its error, in place."""
        out: list[SessionHeader | CorruptRecordError] = []
        for key, parent, blob in rows:
            try:
                out.append(self._decode_row(key, blob))
            except CorruptRecordError as exc:
                # The indexed parent column still says where the broken row belongs.
                exc.hint["parent_session"] = bytes(parent).hex() if parent is not None else None
                out.append(exc)
        return out

    def scan_children(
        self, parents: Sequence[SessionId | str]
    ) -> list[SessionHeader | CorruptRecordError]:
        keys = sorted(p.to_bytes() for p in check_session_ids(parents))
        rows = self._query_in(
            "SELECT created_at, id, parent, header FROM sessions"
            " WHERE parent IN ({}) ORDER BY created_at, id",
            keys,
        )
        if len(keys) > _IN_CHUNK:
            rows.sort(key=lambda r: (r[0], bytes(r[1])))  # chunks merged: (created_at, id)
        return self._scanned((key, parent, blob) for _at, key, parent, blob in rows)

    def get_checkpoint(self, session_id: SessionId | str) -> tuple[int, bytes] | None:
        sid = check_session_id(session_id)
        rows = self._query("SELECT seq, data FROM checkpoints WHERE session = ?", (sid.to_bytes(),))
        return (int(rows[0][0]), bytes(rows[0][1])) if rows else None

    # -- writes ---------------------------------------------------------------

    def create_session(self, header: SessionHeader, events: Sequence[Event] = ()) -> int:
        header = check_header(header)
        blob = encode_header(header)
        bodies = [encode_event(e) for e in check_events(events)]
        result: int = self._committer.submit(lambda txn: txn.create(header, blob, bodies))
        return result

    def append(self, session_id: SessionId | str, events: Sequence[Event]) -> list[int]:
        sid = check_session_id(session_id)
        bodies = [encode_event(e) for e in check_events(events)]
        if not bodies:
            if not self.exists(sid):
                raise not_found(sid)
            return []
        seqs: list[int] = self._committer.submit(lambda txn: txn.append(sid, bodies))
        return seqs

    def write_many(self, ops: Sequence[tuple[Any, ...]]) -> list[Any]:
        # Validate and encode every op first (failures stay per op), then hand the
        # rest to the committer at once: one transaction, one fsync.
        prepared: list[Any] = []
        results: list[Any] = [None] * len(ops)
        slots: list[int] = []
        for i, op in enumerate(ops):
            try:
                prepared.append(self._prepare(op))
                slots.append(i)
            except SubagentError as exc:
                results[i] = exc
        for i, request in zip(slots, self._committer.submit_many(prepared)):
            try:
                results[i] = request.outcome()
            except SubagentError as exc:
                results[i] = exc
        return results

    def _prepare(self, op: tuple[Any, ...]) -> Any:
        kind = op[0]
        if kind == "create":
            header = check_header(op[1])
            blob = encode_header(header)
            bodies = [encode_event(e) for e in check_events(op[2])]
            return lambda txn: txn.create(header, blob, bodies)
        if kind == "append":
            sid = check_session_id(op[1])
            bodies = [encode_event(e) for e in check_events(op[2])]
            return lambda txn: txn.append(sid, bodies)
        if kind == "delete":
            sid = check_session_id(op[1])
            return lambda txn: txn.delete(sid)
        if kind == "checkpoint":
            sid = check_session_id(op[1])
            seq = check_int(op[2], "seq")
            blob = check_blob(op[3])
            return lambda txn: txn.put_checkpoint(sid, seq, blob)
        if kind == "projection":
            sid = check_session_id(op[1])
            unit = _unit_name(op[2])
            seq = check_int(op[3], "seq", minimum=-1)
            blob = check_blob(op[4])
            return lambda txn: txn.put_projection(sid, unit, seq, blob)
        raise invalid(f"unknown write op {kind!r}")

    def raise_delegation_depth(self, session_id: SessionId | str, depth: int) -> SessionHeader:
        sid = check_session_id(session_id)
        check_int(depth, "depth")
        header: SessionHeader = self._committer.submit(lambda txn: txn.raise_depth(sid, depth))
        return header

    def delete_session(self, session_id: SessionId | str) -> None:
        sid = check_session_id(session_id)
        self._committer.submit(lambda txn: txn.delete(sid))

    def put_checkpoint(self, session_id: SessionId | str, seq: int, data: bytes) -> None:
        sid = check_session_id(session_id)
        check_int(seq, "seq")
        blob = check_blob(data)
        self._committer.submit(lambda txn: txn.put_checkpoint(sid, seq, blob))

    def put_projection(self, session_id: SessionId | str, unit: str, seq: int, data: bytes) -> None:
        sid = check_session_id(session_id)
        name = _unit_name(unit)
        check_int(seq, "seq", minimum=-1)
        blob = check_blob(data)
        self._committer.submit(lambda txn: txn.put_projection(sid, name, seq, blob))

    def get_projection(self, session_id: SessionId | str, unit: str) -> tuple[int, bytes] | None:
        sid = check_session_id(session_id)
        rows = self._query(
            "SELECT seq, data FROM projection_cache WHERE session = ? AND unit = ?",
            (sid.to_bytes(), _unit_name(unit)),
        )
        return (int(rows[0][0]), bytes(rows[0][1])) if rows else None

    def get_projections(self, unit: str) -> dict[SessionId, tuple[int, bytes]]:
        rows = self._query(
            "SELECT session, seq, data FROM projection_cache WHERE unit = ?", (_unit_name(unit),)
        )
        return self._projection_rows(rows)

    def _projection_rows(self, rows: Iterable[Any]) -> dict[SessionId, tuple[int, bytes]]:
        """``(session, seq, data)`` rows by session id (shared id objects)."""
        ids = self._session_id
        return {ids(bytes(k)): (int(q), bytes(d)) for k, q, d in rows}

    def get_projections_of(
        self, unit: str, sessions: Iterable[SessionId | str]
    ) -> dict[SessionId, tuple[int, bytes]]:
        name = _unit_name(unit)
        keys = [s.to_bytes() for s in check_session_ids(sessions)]
        rows = self._query_in(
            "SELECT session, seq, data FROM projection_cache WHERE unit = ? AND session IN ({})",
            keys,
            name,
        )
        return self._projection_rows(rows)

    def _query_in(self, sql: str, keys: list[bytes], *params: Any) -> list[Any]:
        """Rows of ``sql`` (whose ``{}`` is an ``IN`` list, after ``params``) for every
        key, in chunks under SQLite's bound-variable limit."""
        rows: list[Any] = []
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = keys[i : i + _IN_CHUNK]
            rows += self._query(sql.format(",".join("?" * len(chunk))), (*params, *chunk))
        return rows

    def drop_projections(self) -> None:
        self._committer.submit(lambda txn: txn.drop_projections())

    def flush(self, session_id: SessionId | str | None = None) -> None:
        if session_id is not None:
            check_session_id(session_id)
        if self._sync in ("FULL", "EXTRA"):
            if self._closed:
                raise store_closed(self)
            return  # every append was fsynced before it returned
        # WAL + NORMAL: a checkpoint fsyncs the WAL before copying it back.
        self._committer.exclusive(
            lambda: self._writer.conn.execute("PRAGMA wal_checkpoint(FULL)").fetchall()
        )

    # -- lifecycle ------------------------------------------------------------

    def statistics(self) -> StoreStatistics:
        """A snapshot of the write-side counters (see :class:`StoreStatistics`)."""
        w = self._writer
        return StoreStatistics(
            transactions=w.transactions,
            write_requests=w.requests,
            events_appended=w.events,
            largest_batch=w.largest_batch,
            pending=self._committer.pending,
        )

    def close(self) -> None:
        self._header_cache.clear()
        self._id_cache.clear()
        with self._pool_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        self._committer.close(self._writer.conn.close)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<SqliteStore {self.path!r} {state}>"


def _unit_name(unit: object) -> str:
    return check_unit(unit, max_len=200)
