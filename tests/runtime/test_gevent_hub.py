"""On the gevent runtime nothing stalls the hub: durable appends run in gevent's threadpool."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import gevent
import pytest
from subagents.actors import Runtime

pytestmark = pytest.mark.backend_specific


def test_ticker_keeps_ticking_during_heavy_durable_appends(tmp_path: Path) -> None:
    """A ticker greenlet runs throughout thousands of SQLite-durable turns (each an
    fsync'd group commit in the session writer), and the largest gap between its
    ticks stays far below what one blocking commit burst on the hub would cause."""
    gaps: list[float] = []
    stop = gevent.event.Event()

    def ticker() -> None:
        last = time.monotonic()
        while not stop.is_set():
            gevent.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    with Runtime(str(tmp_path / "hub.db"), backend="gevent") as rt:
        agents = [rt.spawn(lambda turn: "x" * 200) for _ in range(8)]
        tick = gevent.spawn(ticker)
        for i in range(400):
            for agent in agents:
                agent.followup({"n": i, "payload": "y" * 200})
        for agent in agents:
            assert agent.wait_idle(120)
        rt.sessions.flush(timeout=120)
        stop.set()
        tick.join(10)
        assert rt.store is not None
        stats = rt.store.statistics()  # type: ignore[attr-defined]
        assert stats.transactions >= 1
    assert len(gaps) > 10
    # Generous bound for a loaded 2-core CI machine; a hub blocked by the commits
    # (9,600 durable events) would show gaps of seconds.
    assert max(gaps) < 0.25, sorted(gaps)[-5:]


def test_foreign_thread_gets_a_clear_error(start_os_thread) -> None:  # type: ignore[no-untyped-def]
    """A gevent runtime is driven from its hub's thread: a blocking call from another
    OS thread fails at once with WRONG_THREAD (instead of waiting on a hub that cannot
    wake it); a plain follow-up, which only enqueues, is accepted from anywhere."""
    from subagents.protocol import ErrorCode, SubagentError

    with Runtime(backend="gevent") as rt:
        agent = rt.spawn("echo")

        def from_thread() -> list[str]:
            codes = []
            for call in (lambda: rt.spawn("echo"), lambda: agent.wait_idle(1), rt.wait_idle):
                try:
                    call()
                except SubagentError as exc:
                    codes.append(exc.code)
            agent.followup("from another thread")
            return codes

        thread = start_os_thread(from_thread)
        while not thread.join(0):
            gevent.sleep(0.001)  # keep the hub running while the thread works
        assert thread.result() == [ErrorCode.WRONG_THREAD] * 3
        assert agent.wait_idle(10)
        outputs = [r.event for r in rt.sessions.read(agent.session_id)]
        assert any(getattr(e, "content", None) == "from another thread" for e in outputs)


def test_waiting_calls_keep_no_pool_of_a_destroyed_hub(start_os_thread: Any) -> None:
    """``run_waiting`` makes a pool per hub; threads that each ran a hub and
    destroyed it leave at most one pool behind (each kept its hub for ever)."""
    from subagents.actors._kernel import _waiting
    from subagents.actors._kernel._backend import GEVENT

    def one_hub() -> None:
        hub = gevent.get_hub()
        assert GEVENT.run_waiting(sum, [1, 2]) == 3
        hub.destroy(True)

    for _ in range(6):
        start_os_thread(one_hub).result(10)
    assert len(_waiting._POOLS) <= 2  # the last one's, and this thread's if it made one


def test_the_lease_lookup_of_a_wake_runs_off_the_hub(tmp_path: Path) -> None:
    """Where is the holder of a session that is not live here (an interrupt, a report
    or an adoption forwarded to it): asked of the store in the hub's threadpool, so
    a store that hangs -- a stopped PostgreSQL server -- hangs that call only, not
    every greenlet (it was asked on the hub)."""
    import threading

    with Runtime(str(tmp_path / "s.db"), backend="gevent") as rt:
        agent = rt.spawn("echo")
        store = rt.store
        assert store is not None
        asked_on: list[bool] = []
        hub_thread = threading.get_ident()
        real = store.get_lease

        def get_lease(session_id: Any) -> Any:
            asked_on.append(threading.get_ident() == hub_thread)
            return real(session_id)

        store.get_lease = get_lease  # type: ignore[method-assign]
        rt.sessions.wake_address(agent.session_id)
        assert asked_on == [False]


def test_a_store_is_opened_and_closed_off_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a store (connecting to a database server, identifying a file) and
    closing it (which waits for a write in flight) run in the hub's threadpool: a
    server that hangs stalls the caller, not every greenlet (both ran on the hub)."""
    import threading

    from subagents.actors import _runtime

    hub_thread = threading.get_ident()
    on_hub: list[tuple[str, bool]] = []
    real_open = _runtime.open_store

    def open_store(location: Any) -> Any:
        on_hub.append(("open", threading.get_ident() == hub_thread))
        store = real_open(location)
        real_close = store.close

        def close() -> None:
            on_hub.append(("close", threading.get_ident() == hub_thread))
            real_close()

        store.close = close
        return store

    monkeypatch.setattr(_runtime, "open_store", open_store)
    with Runtime(str(tmp_path / "s.db"), backend="gevent") as rt:
        rt.spawn("echo").followup("x")
        assert rt.wait_idle(10)
    assert on_hub == [("open", False), ("close", False)]
