"""Calls that wait long on something outside (a model's answer, another host),
run off a gevent hub without taking the hub's own threadpool.

The hub's threadpool (:meth:`Backend.run_blocking`) is small -- gevent gives it
ten workers -- and short calls share it: SQLite commits, lease renewals, listings.
Ten model requests waiting a minute each would hold every worker for that minute
and stall every short call behind them. So a hub gets a second pool for waiting
calls, made on first use: up to :data:`WAITING_POOL_SIZE` workers, each ending
after :data:`IDLE_SECONDS` without work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final

from gevent._hub_local import get_hub_if_exists
from gevent.threadpool import ThreadPool

__all__ = ["IDLE_SECONDS", "WAITING_POOL_SIZE", "apply_in", "run_waiting", "waiting_pool"]

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


def run_waiting(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)`` in the calling hub's waiting pool (inline without a hub).

    Its exception propagates unchanged.
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
    return apply_in(pool, fn, args, kwargs)


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
