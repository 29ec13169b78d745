"""Calls that wait long on something outside (a model's answer, another host),
run off a gevent hub without taking the hub's own threadpool.

The hub's threadpool (:meth:`Backend.run_blocking`) is small -- gevent gives it
ten workers -- and short calls share it: SQLite commits, lease renewals, listings.
Ten model requests waiting a minute each would hold every worker for that minute
and stall every short call behind them. So a hub gets a second pool for waiting
calls, made on first use: up to :data:`WAITING_POOL_SIZE` workers, each ending
after :data:`IDLE_SECONDS` without work. A caller that passes an abort signal or a
deadline gives up on a call still waiting for a worker when either comes first
(the call then never runs); a call a worker took runs to its end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

import gevent
import gevent.event
from gevent._hub_local import get_hub_if_exists
from gevent.threadpool import ThreadPool

from ._gevent import native_allocate_lock, native_get_ident


class _Signal(Protocol):
    """What a waiting call needs of an :class:`~._signal.AbortSignal` (not imported:
    that module imports the backends, which import this one)."""

    def add_listener(self, fn: Callable[[Any], object]) -> Callable[[], None]: ...

    def raise_if_aborted(self) -> None: ...


__all__ = [
    "IDLE_SECONDS",
    "WAITING_POOL_SIZE",
    "NoWorkerInTime",
    "apply_in",
    "run_waiting",
    "waiting_pool",
]

#: Waiting calls one hub runs at once; more wait (cooperatively) for a worker.
WAITING_POOL_SIZE: Final = 256

#: Seconds a worker of the waiting pool stays without work before it ends.
IDLE_SECONDS: Final = 30.0

# By hub. A pool holds its hub, so an entry would outlive the hub's destruction:
# the entries of destroyed hubs are dropped when a pool is made.
_POOLS: dict[Any, ThreadPool] = {}
_LOCK = threading.Lock()


def waiting_pool(hub: Any) -> ThreadPool | None:
    """The waiting pool of ``hub``, or ``None`` before its first waiting call."""
    return _POOLS.get(hub)


def run_waiting(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    signal: _Signal | None = None,
    deadline: float | None = None,
) -> Any:
    """``fn(*args, **kwargs)`` in the calling hub's waiting pool (inline without a hub).

    Its exception propagates unchanged. While the call waits for a free worker
    (every one busy), ``signal`` aborting or ``deadline`` (``time.monotonic``)
    passing gives up on it: it never runs. Once a worker took it, ``fn`` runs to
    its end (it sees the signal and its deadline itself).

    Raises:
        SubagentError: ``CANCELLED`` when ``signal`` aborted before a worker took it.
        NoWorkerInTime: ``deadline`` passed before a worker took it.
    """
    hub = get_hub_if_exists()
    if hub is None:
        return fn(*args, **kwargs)
    with _LOCK:
        pool = _POOLS.get(hub)
        if pool is None:
            for gone in [h for h in _POOLS if h.loop is None]:  # destroyed hubs
                del _POOLS[gone]  # (its idle workers end on their own)
            pool = _POOLS[hub] = ThreadPool(
                WAITING_POOL_SIZE, hub=hub, idle_task_timeout=IDLE_SECONDS
            )
    if signal is None and deadline is None:
        return apply_in(pool, fn, args, kwargs)
    return _apply_until(hub, pool, _Job(fn, args, kwargs), signal, deadline)


class NoWorkerInTime(TimeoutError):
    """A waiting call's deadline passed before a worker of the pool took it."""


class _Job:
    """A call a worker runs unless its caller gave up on it first."""

    def __init__(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> None:
        self._call = (fn, args, kwargs)
        self._lock = native_allocate_lock()  # held for a few bytecodes, by either thread
        self._state = "queued"  # then "started" or "abandoned"

    def run(self) -> tuple[bool, Any]:
        with self._lock:
            if self._state == "abandoned":
                return False, None
            self._state = "started"
        return _outcome(*self._call)

    def abandon(self) -> bool:
        """Give up on the call: True unless a worker has started it already."""
        with self._lock:
            if self._state == "queued":
                self._state = "abandoned"
            return self._state == "abandoned"


def _apply_until(
    hub: Any, pool: ThreadPool, job: _Job, signal: _Signal | None, deadline: float | None
) -> Any:
    """Run ``job`` in ``pool``, giving up while it waits for a worker (see
    :func:`run_waiting`). ``pool.spawn`` itself waits for a free worker, so it
    runs in a greenlet of its own that giving up kills."""
    wake = gevent.event.Event()

    def listener(_reason: Any) -> None:
        if hub.thread_ident == native_get_ident():
            wake.set()
        elif hub.loop is not None:
            hub.loop.run_callback_threadsafe(wake.set)

    remove = signal.add_listener(listener) if signal is not None else None
    queued = gevent.spawn(pool.spawn, job.run)
    try:
        waiting: Any = queued
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            gevent.wait([waiting, wake], count=1, timeout=left)
            if waiting.ready():
                if waiting is not queued:
                    break  # the call ended
                waiting = queued.get()  # handed to the pool: now wait for its result
                continue
            if job.abandon():  # it never runs
                queued.kill(block=False)
                if signal is not None:
                    signal.raise_if_aborted()
                raise NoWorkerInTime("no worker of the waiting pool was free in time")
            # A worker runs it: it sees the abort or its deadline on its own.
            waiting = queued.get() if waiting is queued else waiting
            break
        ok, result = waiting.get()
    finally:
        if remove is not None:
            remove()
    if not ok:
        raise result
    return result


def apply_in(
    pool: ThreadPool, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``fn(*args, **kwargs)`` in a worker of ``pool``, waited for cooperatively; its
    exception propagates unchanged."""
    ok, result = pool.apply(_outcome, (fn, args, kwargs))
    if not ok:
        raise result
    return result


def _outcome(fn: Callable[..., Any], args: Any, kwargs: Any) -> tuple[bool, Any]:
    """Hand the exception back as a value: raised in a worker, the pool would print
    it as an error."""
    try:
        return True, fn(*args, **kwargs)
    except BaseException as exc:
        return False, exc
