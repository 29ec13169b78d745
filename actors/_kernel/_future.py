"""A settle-once result future that works on both backends.

``pykka.Future`` has no completion callbacks, and a run's result is settled by one
actor and observed by others (lifecycle listeners, ``dispose()``, the caller). This
future is settled exactly once, runs callbacks outside its lock, and blocks a
waiter with the primitive that fits the *waiter's* context
(:func:`~subagents.actors._backend.current_backend`), so a greenlet waits
cooperatively and an OS thread with a real lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from subagents.protocol import ErrorCode, SubagentError

from ._backend import GEVENT, current_backend
from ._checks import check_timeout
from ._gevent import native_get_ident
from ._listeners import hear

__all__ = ["ResultFuture", "Waiter"]

T = TypeVar("T")
logger = logging.getLogger("subagents")

_PENDING: Any = object()


class ResultFuture(Generic[T]):
    """A value or an exception, settled once.

    ``get(timeout=None)`` returns the value or raises the exception;
    ``add_done_callback(fn)`` calls ``fn(future)`` once settled (at once if it
    already is). A raising callback is logged and does not affect the others.
    """

    __slots__ = ("_callbacks", "_exc", "_lock", "_value", "_waiters")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: Any = _PENDING
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[ResultFuture[T]], object]] = []
        self._waiters: list[Any] = []

    def done(self) -> bool:
        """True once a value or an exception is set."""
        return self._value is not _PENDING

    def set_result(self, value: T) -> bool:
        """Settle with ``value``; False (and no effect) when already settled."""
        return self._settle(value, None)

    def set_exception(self, exc: BaseException) -> bool:
        """Settle with ``exc``; False (and no effect) when already settled."""
        return self._settle(None, exc)

    def _settle(self, value: Any, exc: BaseException | None) -> bool:
        with self._lock:
            if self._value is not _PENDING:
                return False
            self._exc = exc
            self._value = value
            waiters, self._waiters = self._waiters, []
            callbacks, self._callbacks = self._callbacks, []
        for event in waiters:
            event.wake()
        for fn in callbacks:
            self._run_callback(fn)
        return True

    def _run_callback(self, fn: Callable[[ResultFuture[T]], object]) -> None:
        hear(fn, self, "result callback")

    def add_done_callback(self, fn: Callable[[ResultFuture[T]], object]) -> None:
        """Call ``fn(self)`` once settled; immediately if already settled."""
        with self._lock:
            if self._value is _PENDING:
                self._callbacks.append(fn)
                return
        self._run_callback(fn)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until settled or ``timeout``; True when settled.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for a timeout that is not ``None``
                or seconds >= 0 (on either backend).
        """
        timeout = check_timeout(timeout)
        if self._value is not _PENDING:
            return True
        event = _waiter()
        with self._lock:
            if self._value is not _PENDING:
                return True
            self._waiters.append(event)
        if event.wait(timeout):
            return True
        with self._lock:
            if event in self._waiters:
                self._waiters.remove(event)
        return self._value is not _PENDING

    def get(self, timeout: float | None = None) -> T:
        """The value, or raise the settled exception.

        Raises:
            SubagentError: code ``TIMEOUT`` when not settled within ``timeout``.
        """
        if not self.wait(timeout):
            raise SubagentError(f"result not settled within {timeout} s", code=ErrorCode.TIMEOUT)
        if self._exc is not None:
            raise self._exc
        result: T = self._value
        return result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The settled exception (None for a value); ``TIMEOUT`` as in :meth:`get`."""
        if not self.wait(timeout):
            raise SubagentError(f"result not settled within {timeout} s", code=ErrorCode.TIMEOUT)
        return self._exc

    def __repr__(self) -> str:
        state = "pending" if self._value is _PENDING else ("failed" if self._exc else "done")
        return f"<ResultFuture {state}>"


class Waiter:
    """An event for one blocked caller that any thread or greenlet may wake.

    A gevent event must be set from its hub's thread; a waker in another OS thread
    (a ThreadingActor, a threadpool worker) schedules the set on that hub's loop.
    """

    __slots__ = ("event", "hub", "thread")

    def __init__(self) -> None:
        backend = current_backend()
        self.event = backend.event()
        if backend is GEVENT:
            import gevent

            self.hub: Any = gevent.get_hub()
            self.thread: int | None = native_get_ident()
        else:
            self.hub = None
            self.thread = None

    def wake(self) -> None:
        if self.hub is None or self.thread == native_get_ident():
            self.event.set()
        else:
            self.hub.loop.run_callback_threadsafe(self.event.set)

    def wait(self, timeout: float | None) -> bool:
        return bool(self.event.wait(timeout))


_waiter = Waiter
