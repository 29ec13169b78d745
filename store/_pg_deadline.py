"""A deadline on every wait for the PostgreSQL server's answer, and the reads
that go on through the server's faults (:class:`PgReader`).

A server that hangs -- alive to TCP, answering nothing: a storage stall, a
frozen host or VM -- would block a statement for ever: TCP keeps the connection
up (the kernel acknowledges what is sent) and the server-side
``statement_timeout`` needs the server to run. So every connection the store
makes is a :class:`DeadlineConnection`: each wait for the server is registered
with the process's one watchdog thread, which shuts the connection's socket
down when its deadline passes. The wait then fails at once (libpq reads the
end of the stream), as if the server had dropped the connection, and the call
raises :class:`DeadlinePassed` -- ``PERSISTENCE_UNAVAILABLE`` to the store's
callers. What the cut statement did is unknown (as for a connection killed
mid-transaction): its transaction never commits unless its ``COMMIT`` had
reached the server, and the connection is done for.

The watchdog is a native thread even under gevent monkey-patching (a stalled
statement may block a real thread: the runtime's threadpool), started at the
first guarded wait, and made again in the child of a fork. Shutting a socket
down is safe from any thread; the watchdog does it holding the lock the waiter
must take to unregister, so the socket is the connection's own (its number not
reused by then).

:class:`PgReader` is the store's read path: a pooled connection, one more try
on a fresh connection when a restart had dropped it (and its idle siblings), and
while the server was last seen unreachable a connection of its own (bounded):
see its docstring.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg_pool
from subagents.protocol import ErrorCode, SubagentError

from ._native import native_lock, original_sleep, start_native_thread
from ._pg_schema import pg_error

__all__ = [
    "DIRECT_READS",
    "DeadlineConnection",
    "DeadlinePassed",
    "PgReader",
    "ReadPool",
    "deadline_passed",
]

#: Most reads on connections of their own at once (see :class:`PgReader`): a
#: store holds at most ``pool_size`` + this + 1 (the writer's) connections, and a
#: runtime's listener one more.
DIRECT_READS = 2


# psycopg_pool's task of reconnecting: not its public API (a later version may
# move it; then the pool backs off as it does by itself).
_AddConnection: Any = getattr(getattr(psycopg_pool, "pool", None), "AddConnection", None)

#: Longest pause between the read pool's attempts to connect (seconds).
RECONNECT_PAUSE = 1.0


class ReadPool(psycopg_pool.ConnectionPool[Any]):
    """The store's read pool: psycopg_pool's, whose attempts to reconnect are never
    more than :data:`RECONNECT_PAUSE` apart.

    The pool backs off exponentially (1, 2, 4, 8 s ... up to its give-up time),
    and the attempts it scheduled during an outage outlive it: once the server is
    back, a read waited for the next one -- seconds, or past the connect timeout,
    when it failed although the server answered (a runtime's lease renewal, which
    reads the server's clock first, waited as long while its leases ran out). A
    refused connect costs the server nothing; a hung one is bounded by the
    connect timeout, in the pool's one worker.
    """

    def schedule_task(self, task: Any, delay: float) -> None:
        if _AddConnection is not None and isinstance(task, _AddConnection):
            delay = min(delay, RECONNECT_PAUSE)
        super().schedule_task(task, delay)


class DeadlinePassed(psycopg.OperationalError):
    """The server did not answer within the connection's deadline (its socket was
    shut down: the connection is broken)."""


def deadline_passed(exc: BaseException) -> bool:
    """True when ``exc`` is (or was caused by) a passed deadline."""
    return isinstance(exc, DeadlinePassed)


class _Watchdog:
    """The deadlines of the waits in flight, and the thread that enforces them."""

    #: How often the thread looks (how late a deadline may be enforced), and how
    #: long it stays with no wait in flight before it ends.
    TICK = 0.1
    LINGER = 10.0

    def __init__(self) -> None:
        self._lock = native_lock()
        self._waits: dict[int, tuple[float, DeadlineConnection]] = {}
        self._next = 0
        self._running = False

    def guard(self, conn: DeadlineConnection, seconds: float) -> int:
        """Register a wait of ``conn`` due in ``seconds``; its token."""
        due = time.monotonic() + seconds
        with self._lock:
            self._next += 1
            token = self._next
            self._waits[token] = (due, conn)
            if not self._running:
                self._running = True
                start_native_thread(self._run, ())
        return token

    def release(self, token: int) -> None:
        """The wait ``token`` is over (after this, its socket is never touched)."""
        with self._lock:
            del self._waits[token]

    def _run(self) -> None:
        sleep = original_sleep()
        idle_since = time.monotonic()
        while True:
            with self._lock:
                now = time.monotonic()
                if self._waits:
                    idle_since = now
                    for due, conn in self._waits.values():
                        if due <= now:
                            conn._cut()
                elif now - idle_since > self.LINGER:
                    # Ends, rather than wake for ever in a process that stopped
                    # using the server; the next wait starts it again.
                    self._running = False
                    return
            sleep(self.TICK)


_watchdog = _Watchdog()


def _forked() -> None:
    # The watchdog thread is not in the child; its lock may have been held.
    global _watchdog
    _watchdog = _Watchdog()


os.register_at_fork(after_in_child=_forked)


class DeadlineConnection(psycopg.Connection[Any]):
    """A connection whose every wait for the server ends within ``deadline_s``
    seconds (None: no deadline), raising :class:`DeadlinePassed`."""

    deadline_s: float | None = None
    _cut_off = False

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        seconds = self.deadline_s
        if seconds is None:
            return super().wait(gen, *args, **kwargs)
        watchdog = _watchdog
        token = watchdog.guard(self, seconds)
        try:
            answer = super().wait(gen, *args, **kwargs)
        except psycopg.OperationalError as exc:
            watchdog.release(token)
            if self._cut_off:
                raise DeadlinePassed(
                    f"the server did not answer within {seconds:g} s (statement_timeout_s)"
                ) from exc
            raise
        except BaseException:
            watchdog.release(token)
            raise
        # Looked at only once released: the watchdog may cut until then, even
        # after the answer came in.
        watchdog.release(token)
        if self._cut_off:
            # The answer was in before the cut: it stands, but the socket is shut:
            # close the connection, or its next user would fail on it.
            self.pgconn.finish()
        return answer

    def _cut(self) -> None:
        """Shut the socket down (the watchdog's thread, holding its lock)."""
        if self._cut_off:
            return
        self._cut_off = True
        with contextlib.suppress(Exception):
            fd = self.pgconn.socket
            sock = socket.socket(fileno=os.dup(fd))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.close()


class _LostConnection(Exception):
    """A pooled connection the server had dropped."""

    def __init__(self, error: psycopg.OperationalError) -> None:
        super().__init__(str(error))
        self.error = error


class PgReader:
    """The store's reads, each on a pooled connection (autocommit), except:

    * a pooled connection the server dropped (a restart drops every idle one):
      the pool checks its connections, and the read runs once more on a fresh
      one, of its own when a direct slot is free (the server still down: it fails
      at once) -- it used to take the next dead one and fail although the server
      was back;
    * no pooled connection free within ``timeout`` while the pool connects fine
      (all held up by a lock, a long listing): ``TIMEOUT``, the server being up;
      when the pool could not connect, the server is unreachable;
    * the server last seen unreachable (a failed connect, a deadline cut): reads
      connect directly, failing as fast as the server refuses them (the pool
      would wait for its reconnection backoff), until one succeeds and puts the
      pool back in use. At most :data:`DIRECT_READS` at once; a read finding none
      free fails ``PERSISTENCE_UNAVAILABLE`` at once.

    ``PoolClosed`` is the caller's to translate.
    """

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool[Any],
        connect: Callable[[], psycopg.Connection[Any]],
        timeout: float,
        closed: Callable[[], bool],
    ) -> None:
        self.pool = pool
        self._connect = connect
        self._timeout = timeout
        self._closed = closed
        self.unreachable = False  # reads connect directly until one succeeds
        self._direct_lock = native_lock()
        self._direct_free = DIRECT_READS
        self._pool_errors = 0  # the pool's failed connects, when last looked at

    def query(self, text: str, args: Any) -> list[Any]:
        """The rows of one statement (``%s`` placeholders)."""
        if self.unreachable:
            rows = self._direct(text, args)
            if rows is None:
                raise SubagentError(
                    "session store failed: the server cannot be reached (the last read"
                    f" found it unreachable, and {DIRECT_READS} reads are trying it again)",
                    code=ErrorCode.PERSISTENCE_UNAVAILABLE,
                )
            return rows
        try:
            return self._pooled(text, args)
        except _LostConnection:
            # A restart drops every idle pooled connection, not only this one: the
            # pool checks them (a dead one fails at once), and the read runs again
            # on a connection of its own -- refused at once while the server is
            # down, where the pool's would be waited for up to the connect timeout
            # -- or, with no direct slot free, on one the pool makes afresh.
            with contextlib.suppress(psycopg_pool.PoolClosed):
                self.pool.check()
            rows = self._direct(text, args)
            if rows is not None:
                return rows
            try:
                return self._pooled(text, args)
            except _LostConnection as again:
                self.unreachable = True
                raise pg_error(again.error) from again.error

    def _pooled(self, text: str, args: Any) -> list[Any]:
        try:
            with self.pool.connection(timeout=self._timeout) as conn:
                try:
                    rows: list[Any] = conn.execute(text, args, binary=True).fetchall()
                    return rows
                except psycopg.OperationalError as exc:
                    if conn.broken and not deadline_passed(exc) and not self._closed():
                        raise _LostConnection(exc) from exc
                    raise
        except psycopg_pool.PoolTimeout as exc:
            errors = self.pool.get_stats().get("connections_errors", 0)
            if errors > self._pool_errors:  # the pool could not connect: an outage
                self._pool_errors = errors
                self.unreachable = True
                raise pg_error(exc) from exc
            raise SubagentError(
                f"session store timed out: no pooled connection came free within"
                f" {self._timeout:g} s (connect_timeout_s): all {self.pool.max_size}"
                " (pool_size) are in use",
                code=ErrorCode.TIMEOUT,
            ) from exc
        except psycopg.Error as exc:
            if deadline_passed(exc):  # it hangs
                self.unreachable = True
            raise pg_error(exc) from exc

    def _direct(self, text: str, args: Any) -> list[Any] | None:
        """A read on a connection of its own; None when no direct slot is free.

        Only a failed connect, a dropped connection or a deadline cut leave the
        server unreachable: a statement the server refused (a plain SQL error, a
        cancelled statement) shows it answering, and puts the pool back in use.
        """
        with self._direct_lock:
            if self._direct_free == 0:
                return None
            self._direct_free -= 1
        try:
            try:
                conn = self._connect()
            except psycopg.Error as exc:
                self.unreachable = True
                raise pg_error(exc) from exc
            with conn:
                try:
                    rows: list[Any] = conn.execute(text, args, binary=True).fetchall()
                except psycopg.Error as exc:
                    if conn.broken or deadline_passed(exc):
                        self.unreachable = True
                    else:
                        self._answered()
                    raise pg_error(exc) from exc
        finally:
            with self._direct_lock:
                self._direct_free += 1
        self._answered()
        return rows

    def _answered(self) -> None:
        """The server answered a direct read: reads use the pool again."""
        if self.unreachable:
            self.unreachable = False
            with contextlib.suppress(psycopg_pool.PoolClosed):
                self.pool.check()  # drop the connections the outage broke
        self._pool_errors = self.pool.get_stats().get("connections_errors", 0)
