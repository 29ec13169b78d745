"""What ``gevent_server.py`` keeps beside the runtime: who owns which session
(:class:`Owners`), which top-level agents stay live (:class:`IdleAgents`), and the
open ``/events`` streams (:class:`EventStreams`)."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import gevent
import gevent.event
import gevent.queue
from gevent_server_http import dumps
from subagents.actors import Agent, Runtime, SubagentEvent
from subagents.protocol import ErrorCode, SubagentError

__all__ = ["EventStreams", "IdleAgents", "Owners", "native_lock"]

logger = logging.getLogger("gevent_server")


class Owners:
    """Which client created which session, kept in SQLite beside the session store
    (``None``: in memory, for a memory runtime), or -- given ``connect`` -- in a
    table of a PostgreSQL store's schema (``PostgresStore.connect``).

    A new row is committed (fsynced) in gevent's thread pool, so the hub serves
    other requests meanwhile; on a file, reads use a second connection (WAL: they
    never wait for a commit). On PostgreSQL every statement runs in the thread
    pool (a row lock or a slow server must not stop the hub), and a connection
    the server dropped (a restart) is made again for the next statement.

    A database failure is a ``SubagentError``, as the store's own are: ``TIMEOUT``
    for a lock waited on too long, else ``PERSISTENCE_UNAVAILABLE`` (the server
    down, the disk full...; the driver's exception is its cause).

    Its locks are the OS's own (:func:`native_lock`), even in a monkey-patched
    process: the pool's threads share them."""

    def __init__(self, path: str | None, *, connect: Any = None) -> None:
        self._connect = connect
        self._db: Any = connect() if connect is not None else None
        # psycopg spells its placeholders %s, sqlite3 ?.
        self._mark = "%s" if connect is not None else "?"
        self._failures: tuple[type[Exception], ...] = (sqlite3.Error,)
        self._lock_timeouts: tuple[type[Exception], ...] = ()
        if connect is not None:
            import psycopg

            self._failures = (psycopg.Error,)
            self._lock_timeouts = (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)
        else:
            self._db = _sqlite(path or ":memory:")
        self._writer = self._db
        if path is not None and connect is None:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._writer = _sqlite(path)
        self._lock = native_lock()
        self._write_lock = self._lock if self._writer is self._db else native_lock()
        self._writer.execute(
            "CREATE TABLE IF NOT EXISTS owners"
            " (session_id TEXT PRIMARY KEY, client TEXT NOT NULL, root INTEGER NOT NULL)"
        )
        self._writer.execute("CREATE INDEX IF NOT EXISTS owners_client ON owners (client, root)")

    def _sql(self, sql: str) -> str:
        return sql.replace("?", self._mark)

    def add(self, session_id: str, client: str, *, root: bool) -> None:
        sql = self._sql("INSERT INTO owners VALUES (?, ?, ?) ON CONFLICT DO NOTHING")
        args = (session_id, client, int(root))
        _in_pool(self._run, self._write_lock, True, sql, args)

    def get(self, session_id: str) -> str | None:
        sql = self._sql("SELECT client FROM owners WHERE session_id = ?")
        rows = self._read(sql, (session_id,))
        return None if not rows else str(rows[0][0])

    def roots(self, client: str) -> set[str]:
        sql = self._sql("SELECT session_id FROM owners WHERE client = ? AND root = 1")
        return {r[0] for r in self._read(sql, (client,))}

    def _read(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        if self._connect is None:  # SQLite: a local read, never waiting for a writer
            return self._run(self._lock, False, sql, args)
        return _in_pool(self._run, self._lock, False, sql, args)  # type: ignore[no-any-return]

    def _run(self, lock: Any, write: bool, sql: str, args: tuple[Any, ...]) -> list[Any]:
        try:
            return self._execute(lock, write, sql, args)
        except self._failures as exc:
            busy = getattr(exc, "sqlite_errorcode", None) in _SQLITE_BUSY
            if busy or isinstance(exc, self._lock_timeouts):
                code = ErrorCode.TIMEOUT
            else:
                code = ErrorCode.PERSISTENCE_UNAVAILABLE
            raise SubagentError(f"the owners table failed: {exc}", code=code) from exc

    def _execute(self, lock: Any, write: bool, sql: str, args: tuple[Any, ...]) -> list[Any]:
        with lock:
            conn = self._writer if write else self._db
            try:
                cursor = conn.execute(sql, args)
            except Exception:
                if self._connect is None or not (conn.closed or conn.broken):
                    raise
                # The server dropped the connection (a restart): once more, anew.
                with contextlib.suppress(Exception):
                    conn.close()
                conn = self._db = self._writer = self._connect()
                cursor = conn.execute(sql, args)
            return [] if write else cursor.fetchall()

    def close(self) -> None:
        with self._write_lock:
            self._writer.close()
        with self._lock:
            if self._db is not self._writer:
                self._db.close()


_SQLITE_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _sqlite(path: str) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)


def native_lock() -> Any:
    """A lock of the OS's, even where ``gevent.monkey.patch_all()`` (gunicorn's ``-k
    gevent`` worker does it) made ``threading.Lock()`` gevent's: one of those, shared
    by the threads of gevent's pool, each with a hub of its own, hung them (one
    writer went on, the others waited forever). Held only for a statement, never
    across a greenlet switch, so the OS's lock is the right one either way."""
    monkey = sys.modules.get("gevent.monkey")  # imported by whoever patched
    if monkey is None:
        return threading.Lock()
    return monkey.get_original("_thread", "allocate_lock")()  # the module's own if unpatched


def _in_pool(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in gevent's thread pool, waited for cooperatively. Its exception
    is raised here (raised in a worker, the pool would print it as an error)."""

    def outcome() -> tuple[bool, Any]:
        try:
            return True, fn(*args)
        except Exception as exc:
            return False, exc

    ok, result = gevent.get_hub().threadpool.apply(outcome)
    if not ok:
        raise result
    return result


class IdleAgents:
    """Disposes top-level agents nobody uses (see the module docstring).

    A request that needs an agent live holds it with :meth:`using`: it is not
    disposed meanwhile, and one being disposed finishes first (the request then
    resumes it from the store). A sweep every ``idle_timeout / 2`` seconds (at
    most 5) disposes the agents idle longer than ``idle_timeout``; one as soon as
    more than ``max_live`` were used disposes the least recently used down to 90%
    of ``max_live`` (so the next such sweep is a tenth of ``max_live`` requests
    away, not one).
    """

    def __init__(self, rt: Runtime, *, idle_timeout: float, max_live: int) -> None:
        self.rt = rt
        self.idle_timeout = idle_timeout
        self.max_live = max_live
        self.disposed = 0
        self._pins: dict[str, int] = {}
        self._used: dict[str, float] = {}  # agent id -> when a request last let it go
        self._leaving: dict[str, Agent] = {}  # agent id -> its agent, until it is released
        self._wake = gevent.event.Event()
        self._sweeper = gevent.spawn(self._run)

    @contextlib.contextmanager
    def using(self, agent_id: str) -> Iterator[None]:
        self._pins[agent_id] = self._pins.get(agent_id, 0) + 1
        try:
            leaving = self._leaving.get(agent_id)
            if leaving is not None:
                leaving.wait_disposed(30)
            yield
        finally:
            left = self._pins.pop(agent_id) - 1
            if left:
                self._pins[agent_id] = left
            self.touch(agent_id)

    def touch(self, agent_id: str) -> None:
        """``agent_id`` was used now (least recently used goes first)."""
        self._used[agent_id] = time.monotonic()
        if len(self._used) > self.max_live:
            self._wake.set()

    def live(self) -> list[Agent]:
        """The live top-level agents."""
        return [a for a in self.rt.agents.list() if a.parent_session is None and not a.disposed]

    def sweep(self) -> None:
        """Dispose the agents idle too long, then the least recently used over ``max_live``."""
        now = time.monotonic()
        for aid in [aid for aid, agent in self._leaving.items() if agent.disposed_now()]:
            del self._leaving[aid]
        live = self.live()
        self._used = {a.session_id: self._used.get(a.session_id, 0.0) for a in live}

        def last_used(agent: Agent) -> float:
            return max(agent.idle_since, self._used[agent.session_id])

        low = self.max_live - max(1, self.max_live // 10)
        excess = len(live) - low if len(live) > self.max_live else 0
        for agent in sorted(live, key=last_used):
            if excess <= 0 and now - last_used(agent) < self.idle_timeout:
                break
            if agent.session_id in self._pins or not agent.idle:
                continue  # checked just before disposing: nothing runs in between
            self._leaving[agent.session_id] = agent
            del self._used[agent.session_id]
            agent.dispose(wait=False)  # released in its actor; ``using`` waits for that
            self.disposed += 1
            excess -= 1

    def _run(self) -> None:
        interval = min(max(self.idle_timeout / 2, 0.02), 5.0)
        while True:
            self._wake.wait(interval)
            self._wake.clear()
            try:
                self.sweep()
            except Exception:
                logger.exception("the idle sweep failed")

    def stop(self) -> None:
        self._sweeper.kill()


class EventStreams:
    """The open ``GET /events`` streams. Each subscribes to the runtime's
    ``subagent/start|end`` events and writes one client's (a child's parent is
    the client's) as JSON lines, a heartbeat line when quiet, until ``limit``
    were sent, the client left (a write fails), or :meth:`end` ended them all
    (the server stops: each response ends cleanly)."""

    def __init__(self, rt: Runtime, owners: Owners, *, heartbeat: float) -> None:
        self.rt = rt
        self.owners = owners
        self.heartbeat = heartbeat
        self._queues: set[gevent.queue.Queue[SubagentEvent | None]] = set()

    def __len__(self) -> int:
        return len(self._queues)

    def open(self, client: str, limit: int | None) -> Iterator[bytes]:
        """The lines of a new stream of ``client``'s events."""
        queue: gevent.queue.Queue[SubagentEvent | None] = gevent.queue.Queue()

        def listen(event: SubagentEvent) -> None:
            try:
                owner = event.parent_session and self.owners.get(event.parent_session)
            except SubagentError as exc:  # the store is down: not known to be this client's
                logger.warning("an event left out of a stream: %s", exc)
                return
            if owner == client:
                queue.put(event)

        subscription = self.rt.subagents.subscribe(listen)
        sent = 0
        self._queues.add(queue)
        try:
            yield b'{"type": "subscribed"}\n'
            while limit is None or sent < limit:
                try:
                    event = queue.get(timeout=self.heartbeat)
                except gevent.queue.Empty:
                    # A client that went away is noticed only by a write that
                    # fails: without one, a quiet stream kept its subscription.
                    yield b'{"type": "heartbeat"}\n'
                    continue
                if event is None:  # end()
                    return
                yield (dumps({k: getattr(event, k) for k in event.__slots__}) + "\n").encode()
                sent += 1
        finally:
            self._queues.discard(queue)
            subscription.dispose()

    def end(self) -> None:
        """End every stream open."""
        for queue in self._queues:
            queue.put(None)
