"""Native (OS-thread) primitives, even under gevent monkey-patching.

The stores' locks are held only for a few statements and never across a
greenlet switch, and the SQLite store's callers run in gevent's threadpool (real
threads) where a patched lock would be wrong. So the stores always use the
unpatched ``_thread`` lock.

:class:`HubThread` hosts, under monkey-patching, an object that starts
"threads" of its own (``psycopg_pool``'s worker and scheduler: greenlets then),
and runs every call on it there.
"""

from __future__ import annotations

import _thread
import sys
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = [
    "HubThread",
    "HubThreadStopped",
    "native_lock",
    "original_sleep",
    "start_native_thread",
    "threads_are_greenlets",
]

T = TypeVar("T")


def _original(module: str, name: str, default: Any) -> Any:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched(module):
        return monkey.get_original(module, name)
    return default


native_lock: Callable[[], _thread.LockType] = _original(
    "_thread", "allocate_lock", _thread.allocate_lock
)


def original_sleep() -> Callable[[float], None]:
    """``time.sleep`` as the OS has it, even when gevent patched it (then it would
    switch to the hub)."""
    sleep: Callable[[float], None] = _original("time", "sleep", time.sleep)
    return sleep


def start_native_thread(fn: Callable[..., object], args: tuple[Any, ...]) -> None:
    """Run ``fn(*args)`` in a new OS thread (not a greenlet, even when patched)."""
    _original("_thread", "start_new_thread", _thread.start_new_thread)(fn, args)


def threads_are_greenlets() -> bool:
    """True when gevent patched ``threading``: a ``Thread`` started is a greenlet of
    the starting OS thread's hub."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))


class HubThreadStopped(RuntimeError):
    """A call made on a :class:`HubThread` that was stopping."""


class _Job:
    """A call run in a :class:`HubThread`, and how its caller is woken."""

    __slots__ = ("args", "error", "fn", "lock", "result", "wake")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.result: Any = None
        self.error: BaseException | None = None
        self.lock = native_lock()  # guards wake: the caller may give up waiting
        self.wake: Callable[[], object] | None = None

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:
            self.error = exc
        with self.lock:  # the caller closes its watcher only after taking wake back
            if self.wake is not None:
                self.wake()  # never blocks
                self.wake = None


class HubThread(Generic[T]):
    """An OS thread running a gevent hub of its own, and ``value = make()`` there,
    used only there.

    Under monkey-patching a ``threading.Thread`` is a greenlet of the hub of the OS
    thread that started it, and runs only while that thread waits cooperatively;
    gevent's queue, events and locks then only work within that thread. A store
    opened in a threadpool worker (``run_blocking``) left its pool's worker and
    scheduler on that worker's hub: asleep while the worker waited natively for
    its next task, and gone with the hub once gevent let the worker go. A task
    handed to them from another thread (a connection to make, the stop at close)
    waited until something else woke that hub, or for ever: a close waited 5 s
    for each and left both behind. Here ``make()`` runs in a thread of ours,
    whose hub runs whatever it started until :meth:`stop`, and :meth:`call` runs
    a function on ``value`` as a greenlet of that hub, never in the caller's
    thread: the caller waits cooperatively when its thread has a hub, else
    natively, and the two threads meet only through ``run_callback_threadsafe``,
    an ``async`` watcher and a native lock.
    """

    def __init__(self, make: Callable[[], T]) -> None:
        self._lock = native_lock()  # guards _stopping
        self._stopping = False
        self._started = native_lock()
        self._ended = native_lock()
        self._started.acquire()
        self._ended.acquire()
        self._errors: list[BaseException] = []  # what make raised
        self._hub: Any = None
        self._ident = -1
        self._end: Any = None  # set (in the thread) to end it
        self._running: set[Any] = set()  # greenlets of calls (used in the thread only)
        start_native_thread(self._run, (make,))
        self._started.acquire()
        if self._errors:
            self._ended.acquire()
            raise self._errors[0]

    def _run(self, make: Callable[[], T]) -> None:
        import gevent
        import gevent.event

        self._hub = hub = gevent.get_hub()  # this thread's, new
        self._ident = _original("_thread", "get_ident", _thread.get_ident)()
        self._end = end = gevent.event.Event()
        try:
            try:
                self.value = make()
            except BaseException as exc:
                self._errors.append(exc)
                return
            finally:
                self._started.release()
            while not end.wait(3600):  # a timer: the loop never runs dry
                pass
        finally:
            hub.destroy(destroy_loop=True)
            self._ended.release()

    def _spawn(self, job: _Job) -> None:
        """Start ``job`` (a callback of the thread's hub)."""
        import gevent

        greenlet = gevent.spawn(job.run)
        self._running.add(greenlet)
        greenlet.link(self._running.discard)

    def _finish(self, job: _Job) -> None:
        """Run ``job`` (:meth:`stop`'s), wait for the calls in flight, end the thread."""
        import gevent

        def last() -> None:
            try:
                job.run()
            finally:
                gevent.joinall(list(self._running))
                self._end.set()

        gevent.spawn(last)

    def call(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        """``fn(*args)``, run as a greenlet of the thread's hub; its exception
        propagates. Raises :class:`HubThreadStopped` once :meth:`stop` was called."""
        if _original("_thread", "get_ident", _thread.get_ident)() == self._ident:
            return fn(*args)
        return self._await(_Job(fn, args), self._spawn)

    def stop(self, last: Callable[[T], object]) -> None:
        """Refuse further calls, run ``last(value)`` in the thread, wait for the calls
        in flight there, and end the thread: returns once it ended, raising what
        ``last`` raised. Raises :class:`HubThreadStopped` when called again."""
        try:
            self._await(_Job(last, (self.value,)), self._finish, stopping=True)
        finally:
            with self._ended:
                pass

    def _await(self, job: _Job, start: Callable[[_Job], None], *, stopping: bool = False) -> Any:
        from gevent._hub_local import get_hub_if_exists
        from gevent.hub import Waiter

        hub = get_hub_if_exists()
        watcher: Any = None
        if hub is None:
            done = native_lock()
            done.acquire()
            job.wake = done.release
        else:  # wait in this thread's hub: its other greenlets run meanwhile
            waiter = Waiter(hub)
            watcher = hub.loop.async_()
            watcher.start(waiter.switch, None)
            job.wake = watcher.send
        try:
            with self._lock:
                if self._stopping:
                    raise HubThreadStopped("the thread was stopped")
                if stopping:
                    self._stopping = True
                # Under the lock: a call's callback is queued before stop's.
                self._hub.loop.run_callback_threadsafe(start, job)
            if watcher is None:
                done.acquire()
            else:
                waiter.get()
        finally:
            if watcher is not None:
                with job.lock:
                    job.wake = None  # given up (killed): never send to a closed watcher
                watcher.stop()
                watcher.close()
        if job.error is not None:
            raise job.error
        return job.result
