"""The backend abstraction: one object per runtime that hands out its primitives.

A :class:`Backend` is how every other module stays runtime-agnostic: it names the
pykka actor class, and makes the futures, events, locks and tasks that fit that
runtime. ``THREADING`` gives OS threads and ``threading`` primitives; ``GEVENT``
gives greenlets and gevent primitives in the calling thread's hub, without
monkey-patching. :func:`current_backend` tells a caller which of the two it may
*block* with where it stands.

This module owns no state beyond the two singletons, never patches anything and
never starts work on its own.
"""

from __future__ import annotations

import abc
import logging
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, ParamSpec, Protocol, TypeVar

import gevent
import gevent.event
import gevent.lock
import pykka
from gevent._hub_local import get_hub_if_exists
from subagents.protocol import ErrorCode, SubagentError

from ._gevent import GeventActor, GeventFuture
from ._sigint import InterruptibleEvent, start_blocking_sigint
from ._threadinbox import ThreadActor
from ._waiting import apply_in, run_waiting

__all__ = [
    "GEVENT",
    "THREADING",
    "Backend",
    "EventLike",
    "LockLike",
    "TaskHandle",
    "current_backend",
    "get_backend",
    "threading_is_patched",
]

P = ParamSpec("P")
T = TypeVar("T")

logger = logging.getLogger("subagents")


class EventLike(Protocol):
    """The part of :class:`threading.Event` both backends provide."""

    def set(self) -> None:
        """Set the flag, waking every waiter."""

    def clear(self) -> None:
        """Reset the flag."""

    def is_set(self) -> bool:
        """Whether the flag is set."""

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set (cooperatively on gevent); False on timeout."""


class LockLike(Protocol):
    """The part of :class:`threading.Lock` both backends provide."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock; False when not taken (non-blocking, or timed out)."""

    def release(self) -> None:
        """Give the lock back."""

    def __enter__(self) -> bool: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...


class TaskHandle(Protocol):
    """A started thread or greenlet.

    ``exception`` is what the task raised (it has been logged to the ``subagents``
    logger already), or ``None``.
    """

    @property
    def name(self) -> str:
        """The task's name."""

    @property
    def exception(self) -> BaseException | None:
        """What the task raised, or ``None``."""

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the task ended; False on timeout."""

    def is_alive(self) -> bool:
        """Whether the task still runs."""


class Backend(abc.ABC):
    """The primitives of one runtime. Use the ``THREADING``/``GEVENT`` singletons."""

    name: str
    actor_class: type[pykka.Actor]

    def __repr__(self) -> str:
        return f"<Backend {self.name}>"

    @abc.abstractmethod
    def future(self) -> pykka.Future[Any]:
        """A new unset future of this runtime."""

    @abc.abstractmethod
    def event(self) -> EventLike:
        """A new unset event: ``set``, ``clear``, ``is_set``, ``wait(timeout) -> bool``."""

    @abc.abstractmethod
    def lock(self) -> LockLike:
        """A new non-reentrant lock (``acquire(blocking, timeout=-1)``, ``release``)."""

    @abc.abstractmethod
    def rlock(self) -> LockLike:
        """A new reentrant lock, owned by the acquiring thread or greenlet."""

    @abc.abstractmethod
    def spawn(
        self, fn: Callable[..., object], /, *args: Any, name: str | None = None, **kwargs: Any
    ) -> TaskHandle:
        """Start ``fn(*args, **kwargs)`` now: a daemon thread, or a greenlet.

        The greenlet belongs to the calling thread's hub and first runs when the
        caller next yields to it (blocks cooperatively, or ``sleep(0)``).

        An exception ``fn`` raises is logged to the ``subagents`` logger and kept on
        ``handle.exception``; it never reaches the thread excepthook or the hub.
        """

    @abc.abstractmethod
    def run_blocking(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call a function that blocks on I/O (disk, SQLite) without stalling others.

        Returns its result; its exception propagates unchanged.
        """

    def run_waiting(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call a function that may wait long on something outside (a model's answer,
        another host): as :meth:`run_blocking`, but on gevent in a pool of its own,
        so waiting calls never hold the workers short I/O calls need.
        """
        return self.run_blocking(fn, *args, **kwargs)

    @abc.abstractmethod
    def sleep(self, seconds: float) -> None:
        """Sleep, cooperatively on gevent."""


class _Task:
    """Runs ``fn``, logs and keeps what it raised; the backends say how to join."""

    __slots__ = ("exception", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.exception: BaseException | None = None

    def __repr__(self) -> str:
        state = "alive" if self.is_alive() else "finished"
        return f"<{type(self).__name__} {self.name} {state}>"

    def run(self, fn: Callable[..., object], args: Any, kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            # Logged here rather than by the thread excepthook or the hub, so both
            # backends report a failed task the same way.
            self.exception = exc
            logger.exception("Task %s failed", self.name)
        except BaseException as exc:
            self.exception = exc
            raise

    def join(self, timeout: float | None = None) -> bool:
        raise NotImplementedError

    def is_alive(self) -> bool:
        raise NotImplementedError


class _ThreadTask(_Task):
    __slots__ = ("_thread",)

    def __init__(self, name: str, fn: Callable[..., object], args: Any, kwargs: Any) -> None:
        super().__init__(name)
        # Daemon: the owner joins what it spawns; a forgotten task must not hang exit.
        self._thread = threading.Thread(
            target=self.run, args=(fn, args, kwargs), name=name, daemon=True
        )
        start_blocking_sigint(self._thread.start)  # Ctrl-C is the main thread's

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def is_alive(self) -> bool:
        return self._thread.is_alive()


class _GreenletTask(_Task):
    __slots__ = ("_done",)

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._done: Any = gevent.event.Event()

    def run(self, fn: Callable[..., object], args: Any, kwargs: Any) -> None:
        try:
            super().run(fn, args, kwargs)
        finally:
            self._done.set()

    def join(self, timeout: float | None = None) -> bool:
        return bool(self._done.wait(timeout))

    def is_alive(self) -> bool:
        return not self._done.is_set()


_task_counter = iter(range(1, sys.maxsize))


def _task_name(fn: Callable[..., object], name: str | None) -> str:
    if name is not None:
        return name
    return f"{getattr(fn, '__name__', 'task')}-{next(_task_counter)}"


class _ThreadingBackend(Backend):
    name = "threading"
    actor_class = ThreadActor

    def future(self) -> pykka.Future[Any]:
        return pykka.ThreadingFuture()

    def event(self) -> EventLike:
        if threading_is_patched():
            return threading.Event()  # gevent's, cooperative
        return InterruptibleEvent()

    def lock(self) -> LockLike:
        return threading.Lock()

    def rlock(self) -> LockLike:
        return threading.RLock()

    def spawn(
        self, fn: Callable[..., object], /, *args: Any, name: str | None = None, **kwargs: Any
    ) -> TaskHandle:
        return _ThreadTask(_task_name(fn, name), fn, args, kwargs)

    def run_blocking(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        # An OS thread: blocking it is the point. Under monkey-patching, though,
        # "threads" are greenlets sharing one hub, so the call goes to that hub's
        # threadpool exactly as on GEVENT.
        if threading_is_patched():
            return GEVENT.run_blocking(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    def run_waiting(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if threading_is_patched():
            return GEVENT.run_waiting(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)  # looked up at call time: cooperative when patched


class _GeventLock(gevent.lock.BoundedSemaphore):  # type: ignore[misc]
    """A gevent lock with :class:`threading.Lock`'s conventions.

    ``timeout=-1`` means no timeout, and releasing an unlocked lock raises
    ``RuntimeError``. Like gevent's semaphores, it may be released from another
    OS thread (gevent >= 20.12 wakes the waiter's hub).
    """

    def __init__(self) -> None:
        super().__init__(1)

    def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        if timeout is not None and timeout < 0:
            timeout = None
        return bool(super().acquire(blocking, timeout))

    def release(self) -> Any:
        # Returns the base class's int: release is a cpdef method whose C callers
        # (__exit__) expect one.
        try:
            return super().release()
        except ValueError:
            raise RuntimeError("release unlocked lock") from None


class _GeventRLock(gevent.lock.RLock):  # type: ignore[misc]
    """A gevent reentrant lock with :class:`threading.RLock`'s ``timeout=-1``."""

    def acquire(self, blocking: bool = True, timeout: float | None = -1) -> bool:
        if timeout is not None and timeout < 0:
            timeout = None
        return bool(super().acquire(blocking, timeout))


class _GeventBackend(Backend):
    name = "gevent"
    actor_class = GeventActor

    def future(self) -> pykka.Future[Any]:
        return GeventFuture()

    def event(self) -> EventLike:
        event: EventLike = gevent.event.Event()
        return event

    def lock(self) -> LockLike:
        return _GeventLock()

    def rlock(self) -> LockLike:
        return _GeventRLock()

    def spawn(
        self, fn: Callable[..., object], /, *args: Any, name: str | None = None, **kwargs: Any
    ) -> TaskHandle:
        task = _GreenletTask(_task_name(fn, name))
        gevent.spawn_raw(task.run, fn, args, kwargs)
        return task

    def run_blocking(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        hub = get_hub_if_exists()
        if hub is None:
            # No hub in this OS thread (a worker thread, a plain thread): nothing
            # here can stall, and a threadpool would only add a hop.
            return fn(*args, **kwargs)
        result: T = apply_in(hub.threadpool, fn, args, kwargs)
        return result

    def run_waiting(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        result: T = run_waiting(fn, args, kwargs)
        return result

    def sleep(self, seconds: float) -> None:
        gevent.sleep(seconds)


THREADING: Final[Backend] = _ThreadingBackend()
GEVENT: Final[Backend] = _GeventBackend()

_BY_NAME: Final = {THREADING.name: THREADING, GEVENT.name: GEVENT}


def get_backend(spec: str | Backend) -> Backend:
    """Resolve ``"threading"``, ``"gevent"`` or a :class:`Backend` to a Backend.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for anything else.
    """
    if isinstance(spec, Backend):
        return spec
    backend = _BY_NAME.get(spec) if isinstance(spec, str) else None
    if backend is None:
        msg = f"unknown backend {spec!r}; expected 'threading' or 'gevent'"
        raise SubagentError(msg, code=ErrorCode.INVALID_ARGUMENT, hint={"backend": repr(spec)})
    return backend


def threading_is_patched() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))


def current_backend() -> Backend:
    """The backend whose primitives the caller may block on, here and now.

    The rule, in order:

    1. ``threading`` is monkey-patched by gevent → ``THREADING``: its primitives
       are cooperative already, and they also work across the OS threads gevent
       keeps (its threadpool).
    2. The calling OS thread has a gevent hub → ``GEVENT``: greenlets (actors,
       servers) may be parked in that hub, and blocking the thread on an OS
       primitive would freeze them, possibly waiting for one of them. This holds
       for the thread's main greenlet too.
    3. Otherwise (no hub in this thread: a plain thread, a ``ThreadingActor``, a
       threadpool worker) → ``THREADING``.

    The answer can change from THREADING to GEVENT in a thread once something
    creates a hub there, so ask at the time you block, not once up front.
    """
    if threading_is_patched():
        return THREADING
    if get_hub_if_exists() is not None:
        return GEVENT
    return THREADING
