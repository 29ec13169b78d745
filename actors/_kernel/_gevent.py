"""The native gevent runtime for pykka: ``GeventActor`` and ``GeventFuture``.

Pykka 3 removed its own gevent runtime; this one is written against the three hooks
pykka gives runtimes (``_create_actor_inbox``, ``_create_future``,
``_start_actor_loop``) and needs **no monkey-patching**:

* each actor's loop is a raw greenlet (``gevent.spawn_raw``) in the hub of the OS
  thread that started it; an idle actor is parked in ``hub.switch()`` and costs a
  few KiB, not a thread;
* the inbox is a deque with a single parked consumer. ``put`` is safe from any OS
  thread: from the hub's own thread it schedules the wake-up with
  ``loop.run_callback``, from any other thread with ``loop.run_callback_threadsafe``
  (which also wakes a sleeping loop);
* ``GeventFuture`` keeps its result in a ``gevent.event.AsyncResult``. A greenlet,
  or any thread that has a hub, waits on it cooperatively; an OS thread without a
  hub (a ``ThreadingActor`` asking a ``GeventActor``, a threadpool worker) waits on
  a native lock released by a ``rawlink`` callback, so it never grows a hub of its
  own.

This module never patches anything, never creates OS threads, and never blocks the
hub: a blocking call belongs in ``Backend.run_blocking`` (the hub's threadpool).

Caveat inherited from pykka: its registry lock and each actor's ``actor_stopped``
event are ``threading`` objects. Without patching they are OS primitives that are
only held for a few bytecodes or only ``set()``/``is_set()``, so they never block a
greenlet. Under monkey-patching, patch before importing pykka or ``subagents``.
"""

from __future__ import annotations

import collections
import queue
import sys
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import gevent
import gevent.event
import gevent.monkey
import pykka
from gevent._hub_local import get_hub_if_exists
from greenlet import GreenletExit, getcurrent, greenlet

from . import _fork
from ._actorinit import init_actor

if TYPE_CHECKING:
    from collections.abc import Callable

    from pykka._actor import ActorInbox
    from pykka._envelope import Envelope
    from pykka._future import GetHookFunc
    from pykka._types import OptExcInfo

__all__ = ["GeventActor", "GeventFuture"]

T = TypeVar("T")

# The real OS primitives, even when ``_thread`` has been monkey-patched: the hub's
# ``thread_ident`` is a native thread id, and a hub-less OS thread must block on a
# native lock.
native_get_ident: Callable[[], int] = gevent.monkey.get_original("_thread", "get_ident")
native_allocate_lock: Callable[[], Any] = gevent.monkey.get_original("_thread", "allocate_lock")
native_start_thread: Callable[..., int] = gevent.monkey.get_original("_thread", "start_new_thread")


def call_in_hub(hub: Any, fn: Callable[..., object], *args: Any) -> None:
    """Run ``fn(*args)`` soon in ``hub``'s thread, from any OS thread.

    From the hub's own thread this is a plain ``run_callback``; from another thread
    it is ``run_callback_threadsafe``, which also wakes a loop that is sleeping. A
    destroyed hub (``loop is None``) drops the call: nothing waits there any more.
    """
    loop = hub.loop
    if loop is None:
        return
    if hub.thread_ident == native_get_ident():
        loop.run_callback(fn, *args)
    else:
        loop.run_callback_threadsafe(fn, *args)


class _FutureResult(NamedTuple):
    value: Any = None
    exc_info: OptExcInfo | None = None


class GeventFuture(pykka.Future[T]):
    """:class:`pykka.Future` on a :class:`gevent.event.AsyncResult`.

    Semantics mirror :class:`pykka.ThreadingFuture`: ``get(timeout=)`` raises
    :class:`pykka.Timeout`, a stored exception is re-raised with its traceback,
    setting twice (or after ``set_get_hook``) raises :class:`queue.Full`, and
    ``map``/``filter``/``join``/``reduce``/``pykka.get_all`` work unchanged.

    ``get`` blocks cooperatively in any thread that has a gevent hub (so the hub
    keeps running other greenlets), and on a native lock in a thread without one.
    ``set`` may be called from any thread.
    """

    def __init__(self) -> None:
        super().__init__()
        self._result: Any = gevent.event.AsyncResult()

    def __repr__(self) -> str:
        return "<subagents.GeventFuture>"

    def get(self, *, timeout: float | None = None) -> Any:
        try:
            return super().get(timeout=timeout)
        except NotImplementedError:
            pass

        result = self._result
        if not result.ready():
            if get_hub_if_exists() is not None:
                result.wait(timeout)
            else:
                _wait_without_hub(result, timeout)
            if not result.ready():
                msg = f"{timeout} seconds"
                raise pykka.Timeout(msg)

        value, exc_info = result.value
        if exc_info is not None:
            exc_type, exc_value, exc_traceback = exc_info
            assert exc_type is not None
            if exc_value is None:
                exc_value = exc_type()
            if exc_value.__traceback__ is not exc_traceback:
                raise exc_value.with_traceback(exc_traceback)
            raise exc_value
        return value

    def set(self, value: Any | None = None) -> None:
        if self._result.ready() or self._get_hook is not None:
            raise queue.Full
        self._result.set(_FutureResult(value=value))

    def set_exception(self, exc_info: OptExcInfo | None = None) -> None:
        assert exc_info is None or len(exc_info) == 3
        if exc_info is None:
            exc_info = sys.exc_info()
        if self._result.ready() or self._get_hook is not None:
            raise queue.Full
        self._result.set(_FutureResult(exc_info=exc_info))

    def set_get_hook(self, func: GetHookFunc[T]) -> None:
        if self._result.ready():
            raise queue.Full
        super().set_get_hook(func)


def _wait_without_hub(result: Any, timeout: float | None) -> None:
    # An OS thread with no hub: park on a native lock that a rawlink callback
    # releases. The callback runs in the setter's hub (or inline when ready already),
    # is called at most once, and only ever releases the lock acquired here.
    lock = native_allocate_lock()
    lock.acquire()

    def wake(_source: object) -> None:
        lock.release()

    result.rawlink(wake)
    try:
        if not result.ready():
            lock.acquire(True, -1 if timeout is None else max(timeout, 0.0))
    finally:
        result.unlink(wake)


class _Inbox:
    """A deque with one consumer greenlet, safe to ``put`` into from any thread.

    The consumer publishes itself in ``_waiter`` *before* re-checking the deque and
    parking, and ``put`` appends *before* reading ``_waiter``: so either ``put``
    sees the waiter and schedules a wake-up, or the waiter sees the item (the GIL
    orders the two). Wake-ups run in the hub's thread and only switch to a greenlet
    that is still parked here, so a stale or duplicate wake-up is a harmless
    spurious one.
    """

    # Slots: about 200 bytes less per idle actor than a __dict__.
    __slots__ = ("_hub", "_waiter", "_wake_pending", "queued")

    def __init__(self) -> None:
        #: The envelopes not yet taken, oldest first. Producers append; the one
        #: consumer may also pop from the left itself (an agent's run of turns).
        self.queued: collections.deque[Envelope[Any]] = collections.deque()
        self._waiter: Any = None
        self._hub: Any = None
        self._wake_pending = False

    def put(self, envelope: Envelope[Any], /) -> None:
        self.queued.append(envelope)
        if self._waiter is not None and not self._wake_pending:
            self._wake_pending = True
            call_in_hub(self._hub, self._wake)

    def get(self) -> Envelope[Any]:
        items = self.queued
        while not items:
            self._park()
        return items.popleft()

    def empty(self) -> bool:
        return not self.queued

    def qsize(self) -> int:
        return len(self.queued)

    def _park(self) -> None:
        hub = self._hub
        if hub is None:
            hub = self._hub = gevent.get_hub()
        born = _fork.generation
        self._waiter = getcurrent()
        try:
            if not self.queued:
                hub.switch()
        finally:
            self._waiter = None
        if _fork.generation != born:
            _fork.abandon()  # a copy's actor, woken in the child of a fork

    def _wake(self) -> None:
        # Runs in the hub greenlet.
        self._wake_pending = False
        waiter = self._waiter
        if waiter is not None:
            waiter.switch()


class GeventActor(pykka.Actor):
    """:class:`pykka.Actor` whose loop is a greenlet in the starting thread's hub.

    Use it exactly like :class:`pykka.ThreadingActor`. Blocking calls inside an
    actor (``ask``, ``future.get``) are cooperative; CPU-bound or blocking I/O work
    belongs in ``Backend.run_blocking`` so the hub keeps serving other actors.
    """

    actor_stopped: Any  # a gevent.event.Event here, see __init__
    _actor_greenlet: greenlet

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # pykka.Actor.__init__'s fields, with a gevent Event for pykka's
        # threading.Event: pykka itself only set()s and is_set()s it; ours waits
        # cooperatively for anyone who calls wait(), and is 1 KiB lighter per actor
        # (about 20% of an idle actor).
        init_actor(self, gevent.event.Event())

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        return _Inbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return GeventFuture()

    def _start_actor_loop(self) -> None:
        # A bare greenlet whose parent is this thread's hub, switched to from a loop
        # callback: what gevent.spawn_raw does, minus the ``loop`` attribute it sets
        # (which gives each greenlet a __dict__, ~380 bytes per idle actor).
        hub = gevent.get_hub()
        self._actor_greenlet = greenlet(self._run_actor_loop, hub)
        hub.loop.run_callback(self._actor_greenlet.switch)

    def _run_actor_loop(self) -> None:
        try:
            self._actor_loop()
        except GreenletExit:
            # Killed from outside (gevent.kill): stop as if asked to, and fail the
            # queued asks with ActorDeadError, instead of leaving a registered
            # actor that nobody serves.
            if not self.actor_stopped.is_set():
                self._stop()
            self._actor_loop_teardown()
