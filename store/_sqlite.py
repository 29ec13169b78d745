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
import time
import urllib.parse
from typing import Any, Final

from subagents.protocol import (
    DEFAULT_LIMITS,
    ErrorCode,
    Limits,
    SessionHeader,
    SessionId,
    SubagentError,
)

from ._base import SessionStore, store_closed
from ._committed import CommittedWrites, StoreStatistics
from ._forked import ForkGate, never_free, track
from ._group import GroupCommitter
from ._native import native_lock
from ._queue_reads import SqlQueueReads
from ._reads import SqlReads
from ._schema import (
    check_current,
    database_corrupt,
    foreign_without_wal,
    is_corrupt,
    migrate,
    probe,
    unavailable,
)
from ._sqlite_presence import SqlitePresence
from ._validate import (
    check_session_id,
    invalid,
)
from ._writer import Writer, storage_error

__all__ = ["SqliteStore", "StoreStatistics"]

_IDLE_READERS: Final = 16
_SYNC_MODES: Final = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})


class SqliteStore(SqlitePresence, SqlReads, SqlQueueReads, CommittedWrites, SessionStore):
    """Sessions in one SQLite file; appends are durable when they return.

    Args:
        path: the database file; created and initialised when missing or empty.
        synchronous: SQLite's ``synchronous`` setting. ``"FULL"`` (default) makes
            every append durable on return; with ``"NORMAL"`` appends survive a
            process crash but not a power loss until :meth:`flush`.
        busy_timeout_s: how long a write waits for another process's lock.
        limits: decoding bounds applied to stored bytes.
        read_only: read an existing database of the current schema, never
            writing, never taking its write lock (``subagents tree`` and ``show``
            do); every write fails with ``PERSISTENCE_UNAVAILABLE``. In a
            directory the reader cannot write, SQLite cannot share the WAL's
            index: the database is read as of its last checkpoint; a reader
            that does not own the file and finds no WAL beside it reads it so
            too (SQLite would leave a WAL the owner cannot write).

    Raises:
        SubagentError: ``NOT_A_DATABASE`` (a file that is not a subagents
            database, left untouched), ``DATABASE_CORRUPT`` (an SQLite file that
            SQLite finds damaged; also from any later read or write that meets the
            damage), ``SCHEMA_TOO_NEW`` (written by a newer version, left untouched),
            ``PERSISTENCE_UNAVAILABLE`` (a directory, a missing parent, no
            permission), ``INVALID_ARGUMENT``.
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
        read_only: bool = False,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise invalid(f"path must be a str or os.PathLike, got {type(path).__name__}")
        fspath = os.fspath(path)
        if not isinstance(fspath, str) or not fspath or fspath == ":memory:":
            raise invalid(f"not a database file path: {fspath!r} (use MemoryStore for memory)")
        try:
            if "\0" in fspath:
                raise ValueError("a NUL character")
            os.fsencode(fspath)  # a lone surrogate no file system name can hold
        except (ValueError, UnicodeError) as exc:
            raise invalid(f"not a database file path: {exc}") from None
        if not isinstance(synchronous, str) or synchronous.upper() not in _SYNC_MODES:
            raise invalid(f"synchronous must be one of {sorted(_SYNC_MODES)}, got {synchronous!r}")
        if type(busy_timeout_s) not in (int, float) or not busy_timeout_s >= 0:
            raise invalid(f"busy_timeout_s must be a number >= 0, got {busy_timeout_s!r}")
        if not isinstance(limits, Limits):
            raise invalid(f"limits must be a Limits, got {type(limits).__name__}")
        if type(read_only) is not bool:
            raise invalid(f"read_only must be a bool, got {type(read_only).__name__}")
        self.path = fspath
        self.read_only = read_only
        self._uri: str | None = None  # a read-only connection's URI
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

        if probe(fspath, self._timeout) == "new" and read_only:
            raise unavailable(fspath, "no subagents database to read")
        conn = self._connect_read_only() if read_only else self._connect()
        try:
            if read_only:
                check_current(conn, fspath)
            else:
                migrate(conn, fspath)
                mode = _to_wal(conn, self._timeout)
                if mode != "wal":
                    raise unavailable(fspath, f"cannot switch to WAL (journal_mode is {mode!r})")
                conn.execute(f"PRAGMA synchronous = {self._sync}")
        except sqlite3.Error as exc:
            conn.close()
            if is_corrupt(exc):
                raise database_corrupt(fspath, exc) from exc
            raise unavailable(fspath, exc) from exc
        except BaseException:
            conn.close()
            raise
        self._writer = Writer(conn)
        self._committer = GroupCommitter(self._writer.execute, lambda: store_closed(self))
        self._pid = os.getpid()
        self._gate = ForkGate()  # statements in flight on pooled connections
        self._paused = self._quiet = False
        track(self)

    def _quiesce(self, timeout: float) -> bool:
        """Before a fork: no statement in flight, none starting (see :mod:`._forked`)."""
        self._paused = self._committer.pause(timeout)
        self._quiet = self._gate.close(timeout) and self._paused
        return self._quiet

    def _resume(self) -> None:
        self._gate.open()
        if self._paused:
            self._committer.unpause()

    def _forked(self) -> None:
        """In the child of a fork (see :mod:`._forked`): refuse every call; close the
        copy's connections if no statement was in flight in them, else keep them
        (open, never used)."""
        if self._quiet:
            for conn in (*self._idle, self._writer.conn):
                conn.close()
        else:
            never_free(self._idle, self._writer.conn)
        self._idle = []
        self._gate = ForkGate()
        self._pool_lock = native_lock()
        self._committer.forked()
        self._forked_from = self._pid
        self._closed = True

    def _connect_read_only(self) -> sqlite3.Connection:
        """A ``mode=ro`` connection; where SQLite cannot make the WAL's shared
        memory (a directory the reader cannot write), an ``immutable`` one."""
        base = "file:" + urllib.parse.quote(os.path.abspath(self.path))
        self._uri = base + "?mode=ro"
        if foreign_without_wal(self.path):
            self._uri = base + "?mode=ro&immutable=1"
            return self._connect()
        conn = self._connect()
        try:
            conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()
            return conn
        except sqlite3.Error as exc:
            conn.close()
            # Only where the WAL's index cannot be made or opened: a busy or
            # damaged file read immutably would read torn pages as damage.
            if getattr(exc, "sqlite_errorname", "").startswith(
                ("SQLITE_CANTOPEN", "SQLITE_READONLY")
            ):
                self._uri = base + "?mode=ro&immutable=1"
                return self._connect()
            if is_corrupt(exc):
                raise database_corrupt(self.path, exc) from exc
            raise unavailable(self.path, exc) from exc

    def _connect(self) -> sqlite3.Connection:
        try:
            return sqlite3.connect(
                self._uri or self.path,
                uri=self._uri is not None,
                timeout=self._timeout,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # pooled; used by one thread at a time
            )
        except sqlite3.Error as exc:
            raise unavailable(self.path, exc) from exc

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """Run one read statement on a pooled connection and fetch every row."""
        with self._pool_lock:
            if self._closed:
                raise store_closed(self)
            conn = self._idle.pop() if self._idle else None
        try:
            with self._gate:
                if conn is None:
                    conn = self._connect()
                return conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise storage_error(exc, self.path) from exc
        finally:
            if conn is not None:
                with self._pool_lock:
                    keep = not self._closed and len(self._idle) < _IDLE_READERS
                    if keep:
                        self._idle.append(conn)
                if not keep:
                    with self._gate:
                        conn.close()

    def flush(self, session_id: SessionId | str | None = None) -> None:
        if session_id is not None:
            check_session_id(session_id)
        if self._sync in ("FULL", "EXTRA"):
            if self._closed:
                raise store_closed(self)
            return  # every append was fsynced before it returned
        # WAL + NORMAL: the committed transactions are in the WAL, written but not
        # synced; syncing that file makes them durable (what a checkpoint does first).
        # Not a FULL checkpoint: it waits the busy timeout for any reader of an older
        # snapshot (a paused process, a long read), holds writers off meanwhile, and
        # then comes back busy without syncing.
        self._committer.exclusive(self._sync_wal)

    def _sync_wal(self) -> None:
        """fsync the WAL file (and its directory entry); no WAL file: nothing is
        waiting in one (a checkpoint synced the database file)."""
        try:
            fd = os.open(self.path + "-wal", os.O_RDONLY)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise _unsynced(exc) from None
        try:
            os.fsync(fd)
            folder = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        except OSError as exc:
            raise _unsynced(exc) from None
        finally:
            os.close(fd)

    # -- lifecycle ------------------------------------------------------------

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


def _unsynced(exc: OSError) -> SubagentError:
    return SubagentError(
        f"session store could not sync its log file: {exc}",
        code=ErrorCode.PERSISTENCE_UNAVAILABLE,
    )


def _to_wal(conn: sqlite3.Connection, timeout: float) -> str:
    """Switch to WAL: the journal mode after it. The switch needs the file to
    itself, and SQLite answers ``SQLITE_BUSY`` at once -- not after its busy
    timeout -- while other processes opening it hold a read lock: it is tried
    again until ``timeout`` seconds passed (several workers starting on one new
    file, each identifying it with a locking read)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
            if not busy or time.monotonic() > deadline:
                raise
        time.sleep(0.01)
