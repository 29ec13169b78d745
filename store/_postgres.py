"""``PostgresStore``: sessions in a PostgreSQL database, shared by many processes on
many hosts (psycopg 3, ``psycopg_pool``; the ``postgres`` extra).

Theory of operation:

* **Writes** go through the same :class:`~._group.GroupCommitter` as SQLite's:
  concurrent calls of this process coalesce into one transaction on the store's
  one write connection (:class:`~._pg_txn.PgWriter`), each returning after its
  ``COMMIT`` (``synchronous_commit`` as the server has it: on by default, so
  after the WAL was flushed). Between processes, row locks serialise what must
  be serial (see :mod:`._pg_txn`).
* **Reads** take a connection from a ``psycopg_pool.ConnectionPool``
  (autocommit: each statement its own snapshot, never waiting for a writer).
  A read that finds its pooled connection dead (the server restarted) is
  retried once on a fresh one; one that finds no pooled connection free in time
  fails ``TIMEOUT``; while the server is unreachable, reads connect directly, a
  bounded few at once (:class:`~._pg_deadline.PgReader`). Under gevent
  monkey-patching the pool's worker and scheduler are greenlets, and gevent's
  primitives work within one thread only: the pool lives on a hub of its own,
  in a thread of the store's (:class:`~._native.HubThread`), where every read
  runs, and which closes the pool and ends with the store.
* **Wake-ups** by ``LISTEN/NOTIFY``: :meth:`PostgresStore.listen` gives a
  runtime a channel (its lease's ``wake`` address, ``pg:<channel>``) on a
  connection of its own; :meth:`PostgresStore.notify` rings it from any process
  on any host. A notification is a hint, as the host doorbell's datagram is: a
  lost one is made up by the holder's periodic sweep. That connection, named
  after its channel, also shows other hosts that the holder still runs
  (:mod:`._pg_listen`): :meth:`PostgresStore.unheard_work` finds the work of
  holders whose process ended, before their leases expire.
* **Opening** classifies the schema first without writing (:mod:`._pg_schema`),
  then migrates it under an advisory lock.

Errors are :class:`~subagents.protocol.SubagentError` s, as for every store:
``PERSISTENCE_UNAVAILABLE`` while the server cannot be reached (a call made
then fails; the same call succeeds once it is back), ``TIMEOUT`` for a lock
held past ``lock_timeout_s``, ``NOT_A_DATABASE`` / ``SCHEMA_TOO_NEW`` for a
schema that is not ours or is newer, left untouched.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from typing import Any, Final

import psycopg
import psycopg_pool
from subagents.protocol import (
    DEFAULT_LIMITS,
    ErrorCode,
    Limits,
    SessionHeader,
    SessionId,
    SubagentError,
)

from ._base import SessionStore, store_closed
from ._committed import CommittedWrites
from ._forked import track
from ._group import GroupCommitter
from ._location import is_postgres_url, redacted_url, split_schema
from ._native import HubThread, HubThreadStopped, threads_are_greenlets
from ._pg_deadline import DeadlineConnection, PgReader, ReadPool
from ._pg_listen import HEARD, HEARD_WAKE, UNHEARD_WORK, PgListener
from ._pg_schema import PG_SCHEMA_VERSION, classify, migrate, pg_error, reorder, translate
from ._pg_txn import PgWriter
from ._queue_reads import SqlQueueReads
from ._reads import SqlReads
from ._validate import check_seconds, check_session_id, invalid

__all__ = ["PgListener", "PostgresStore"]

_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")


#: How long the server lets a connection of ours sit in a transaction with no
#: statement running before it ends the connection. A write transaction runs its
#: statements back to back, so only a process stopped or starved mid-batch meets
#: it -- and its row locks, held meanwhile, stalled every other process's writes
#: to those sessions, their takeover, and (a group commit waiting on the lock)
#: everything they wrote at all, lease renewals too.
_IDLE_IN_TRANSACTION_MS: Final = 10_000


class PostgresStore(SqlReads, SqlQueueReads, CommittedWrites, SessionStore):
    """Sessions in one schema of a PostgreSQL database; appends durable on return.

    Args:
        url: a libpq URL (``postgresql://user@host:port/db``). A ``schema`` query
            parameter (``...?schema=tenant_a``) chooses the schema, as the
            ``schema`` argument does.
        schema: the schema holding the store (created when missing; default
            ``subagents``): lowercase letters, digits and ``_``.
        pool_size: most read connections.
        connect_timeout_s: how long to wait for the server (connecting, or for a
            free pooled connection).
        lock_timeout_s: how long a write waits for another process's row lock.
        statement_timeout_s: how long any statement waits for the server's answer
            (None: for ever). A server that hangs -- alive to TCP, answering
            nothing -- fails the call ``PERSISTENCE_UNAVAILABLE`` after it
            instead of blocking it (``Runtime.close()`` too); what the statement
            did is then unknown, as for a connection killed mid-transaction. Keep
            it above ``lock_timeout_s`` and the longest listing you run.
        limits: decoding bounds applied to stored bytes.
        create: create the store when the schema holds none (False: refuse with
            ``NOT_A_DATABASE``, writing nothing -- what a reader wants).
        read_only: read a store of the current schema version, never migrating
            or writing it (every transaction is read-only: a write fails with
            ``PERSISTENCE_UNAVAILABLE``): what ``subagents tree`` and ``show``
            do. An older schema is ``PERSISTENCE_UNAVAILABLE``, left untouched.

    Raises:
        SubagentError: ``PERSISTENCE_UNAVAILABLE`` (the server cannot be reached),
            ``NOT_A_DATABASE``, ``SCHEMA_TOO_NEW``, ``INVALID_ARGUMENT``.
    """

    durable = True
    blocking = True
    remote_clock = True

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        pool_size: int = 8,
        connect_timeout_s: float = 10.0,
        lock_timeout_s: float = 30.0,
        statement_timeout_s: float | None = 60.0,
        limits: Limits = DEFAULT_LIMITS,
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        if not is_postgres_url(url):
            raise invalid(f"not a postgresql:// URL: {url!r}")
        conninfo, from_url = split_schema(url)
        if from_url is not None and schema is not None and from_url != schema:
            raise invalid(f"the URL names schema {from_url!r} and the argument {schema!r}")
        # An empty ?schema= is refused below, not read as the default schema.
        schema = schema if schema is not None else from_url if from_url is not None else "subagents"
        if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
            raise invalid(f"schema must match [a-z_][a-z0-9_]*, got {schema!r}")
        if type(pool_size) is not int or pool_size < 1:
            raise invalid(f"pool_size must be an int >= 1, got {pool_size!r}")
        for name, value in (
            ("connect_timeout_s", connect_timeout_s),
            ("lock_timeout_s", lock_timeout_s),
        ):
            if type(value) not in (int, float) or not value > 0:
                raise invalid(f"{name} must be a number > 0, got {value!r}")
        if statement_timeout_s is not None and (
            type(statement_timeout_s) not in (int, float) or not 0 < statement_timeout_s < 1e9
        ):
            raise invalid(
                f"statement_timeout_s must be None or a number of seconds > 0,"
                f" got {statement_timeout_s!r}"
            )
        if not isinstance(limits, Limits):
            raise invalid(f"limits must be a Limits, got {type(limits).__name__}")
        if type(read_only) is not bool:
            raise invalid(f"read_only must be a bool, got {type(read_only).__name__}")
        self.url = url
        self.read_only = read_only
        self.schema = schema
        self._limits = limits
        self._header_cache: dict[bytes, SessionHeader] = {}
        self._id_cache: dict[bytes, SessionId] = {}
        self._closed = False
        self._close_lock = threading.Lock()
        self._timeout = float(connect_timeout_s)
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, round(connect_timeout_s)),
            "options": f"-c search_path={schema} -c lock_timeout={round(lock_timeout_s * 1000)}"
            f" -c idle_in_transaction_session_timeout={_IDLE_IN_TRANSACTION_MS}"
            + (" -c default_transaction_read_only=on" if read_only else ""),
        }
        self._conninfo = conninfo
        self._pool_size = pool_size
        self._deadline = None if statement_timeout_s is None else float(statement_timeout_s)
        try:
            admin = self.connect()
        except psycopg.Error as exc:
            raise pg_error(exc, f"opening a session store at {redacted_url(url)}") from exc
        try:
            # Refuse a foreign or newer schema before writing anything.
            kind, version = classify(admin, schema)
            if kind == "new" and (read_only or not create):
                raise SubagentError(
                    f"no subagents store in schema {schema!r} of {redacted_url(url)}",
                    code=ErrorCode.NOT_A_DATABASE,
                    hint={"schema": schema},
                )
            if not read_only:
                migrate(admin, schema)
            elif version < PG_SCHEMA_VERSION:
                raise SubagentError(
                    f"schema {schema!r} of {redacted_url(url)} is at version {version},"
                    f" older than {PG_SCHEMA_VERSION}: open it read-write (a Runtime on it)"
                    " once to migrate it",
                    code=ErrorCode.PERSISTENCE_UNAVAILABLE,
                    hint={"schema": schema, "version": version},
                )
        except psycopg.Error as exc:
            raise pg_error(exc, f"opening a session store at {redacted_url(url)}") from exc
        finally:
            admin.close()
        self._pool_thread: HubThread[psycopg_pool.ConnectionPool[Any]] | None = None
        if threads_are_greenlets():
            # Its worker and scheduler would be greenlets of the hub of the thread
            # opening the store: a threadpool worker's, which runs only while that
            # worker waits cooperatively (see HubThread). They get a hub of their
            # own, where the reads run too.
            self._pool_thread = HubThread(self._make_pool)
        self._pool: psycopg_pool.ConnectionPool[Any] = (
            self._make_pool() if self._pool_thread is None else self._pool_thread.value
        )
        self._reader = PgReader(self._pool, self.connect, self._timeout, lambda: self._closed)
        self._writer = PgWriter(self.connect, self._lost_server)
        self._committer = GroupCommitter(self._writer.execute, lambda: store_closed(self))
        self._pid = os.getpid()
        track(self)

    def _make_pool(self) -> psycopg_pool.ConnectionPool[Any]:
        """The read pool, open (making its first connection in the background)."""
        return ReadPool(
            self._conninfo,
            kwargs=self._kwargs,
            connection_class=DeadlineConnection,
            configure=self._configure,
            min_size=1,
            max_size=self._pool_size,
            timeout=self._timeout,
            num_workers=1,
            name=f"subagents-{self.schema}",
            open=True,
        )

    def _forked(self) -> None:
        """In the child of a fork (see :mod:`._forked`): refuse every call, and
        never close a connection: that would end the parent's session (freeing
        one does not: psycopg ends a connection only in the process that made it)."""
        self._close_lock = threading.Lock()
        self._committer.forked()
        self._forked_from = self._pid
        self._closed = True

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection to the store's schema (the caller closes it),
        its waits bounded by ``statement_timeout_s``."""
        conn = DeadlineConnection.connect(self._conninfo, **self._kwargs)
        conn.deadline_s = self._deadline
        return conn

    def _configure(self, conn: DeadlineConnection) -> None:
        conn.deadline_s = self._deadline  # a pooled connection, as it is made

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        if self._closed:
            raise store_closed(self)
        text, order = translate(sql)
        try:
            if self._pool_thread is not None:  # monkey-patched: on the pool's hub
                rows: list[Any] = self._pool_thread.call(
                    self._reader.query, text, reorder(order, params)
                )
                return rows
            return self._reader.query(text, reorder(order, params))
        except (psycopg_pool.PoolClosed, HubThreadStopped):
            raise store_closed(self) from None

    def _lost_server(self) -> None:
        self._reader.unreachable = True

    def flush(self, session_id: SessionId | str | None = None) -> None:
        if session_id is not None:
            check_session_id(session_id)
        if self._closed:
            raise store_closed(self)
        # Every append was committed before it returned.

    # -- wake-ups --------------------------------------------------------------------

    def listen(self) -> PgListener:
        """A notification channel of this process's own (see :class:`PgListener`)."""
        if self._closed:
            raise store_closed(self)
        return PgListener(self.connect, f"{HEARD}{uuid.uuid4().hex[:24]}")

    def unheard_work(self, now: float) -> list[tuple[SessionId, str]]:
        """Accepted work under live leases whose holders' channels no session of the
        server listens on any more (:mod:`._pg_listen`): their processes ended, or
        lost the server. The caller judges (an unheard holder may be reconnecting)."""
        at = check_seconds(now, "now")
        try:
            rows = self._query(UNHEARD_WORK, (HEARD_WAKE, at))
        except SubagentError as exc:
            if isinstance(exc.__cause__, psycopg.errors.InsufficientPrivilege):
                return []  # pg_stat_activity is not readable here: nothing can be told
            raise
        return [(SessionId.from_bytes(bytes(r[0])), r[1]) for r in rows]

    def notify(self, address: str, payload: bytes) -> bool:
        if not isinstance(address, str) or not address.startswith("pg:"):
            return False
        self._query("SELECT pg_notify(?, ?)", (address[3:], payload.hex()))
        return True

    def clock(self) -> float:
        """The server's clock (``clock_timestamp()``): every host on the store
        measures leases by it."""
        rows = self._query("SELECT extract(epoch FROM clock_timestamp())::float8", ())
        return float(rows[0][0])

    # -- lifecycle ------------------------------------------------------------------

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._header_cache.clear()
        self._id_cache.clear()
        self._committer.close(self._writer.close)
        if self._pool_thread is not None:
            self._pool_thread.stop(psycopg_pool.ConnectionPool.close)  # there, as reads
        else:
            self._pool.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<PostgresStore {redacted_url(self.url)} schema={self.schema} {state}>"
