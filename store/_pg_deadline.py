"""A deadline on every wait for the PostgreSQL server's answer.

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
"""

from __future__ import annotations

import _thread
import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg

from ._native import native_lock, original_sleep

__all__ = ["DeadlineConnection", "DeadlinePassed", "deadline_passed"]


class DeadlinePassed(psycopg.OperationalError):
    """The server did not answer within the connection's deadline (its socket was
    shut down: the connection is broken)."""


def deadline_passed(exc: BaseException) -> bool:
    """True when ``exc`` is (or was caused by) a passed deadline."""
    return isinstance(exc, DeadlinePassed)


def _start_native_thread() -> Callable[..., Any]:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("_thread"):
        original: Callable[..., Any] = monkey.get_original("_thread", "start_new_thread")
        return original
    return _thread.start_new_thread


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
                _start_native_thread()(self._run, ())
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
            if self._cut_off:
                # The answer was in before the cut: it stands, but the socket is
                # shut: close the connection, or its next user would fail on it.
                self.pgconn.finish()
            return answer
        except psycopg.OperationalError as exc:
            if self._cut_off:
                raise DeadlinePassed(
                    f"the server did not answer within {seconds:g} s (statement_timeout_s)"
                ) from exc
            raise
        finally:
            watchdog.release(token)

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
