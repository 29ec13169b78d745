"""The pykka actor contract on GeventActor / GeventFuture (no monkey-patching).

Ordering between actors and the test is forced with events and futures carried in
messages, never with sleeps. Wall-clock is measured in exactly one place (the
hub-stall test), with a generous bound.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import queue
import sqlite3
import time
import tracemalloc
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import gevent.monkey
import greenlet
import pykka
import pytest
from subagents.actors._kernel._backend import GEVENT, THREADING, current_backend
from subagents.actors._kernel._gevent import GeventActor, GeventFuture, native_allocate_lock

pytestmark = pytest.mark.backend_specific

MONKEYPATCHED = gevent.monkey.is_module_patched("threading")


class Recorder(GeventActor):
    def __init__(self, events: list[str] | None = None) -> None:
        super().__init__()
        self.events = events if events is not None else []
        self.value = 0

    def on_start(self) -> None:
        self.events.append("start")

    def on_stop(self) -> None:
        self.events.append("stop")

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, dict) and "raise" in message:
            raise message["raise"]
        if isinstance(message, dict) and "wait" in message:
            message["wait"].wait()
        self.events.append(f"got {message!r}")
        return message

    def add(self, n: int) -> int:
        self.value += n
        return self.value

    def fail(self) -> None:
        raise ValueError("boom")


def _live_greenlets() -> int:
    return sum(
        1
        for obj in gc.get_objects()
        if isinstance(obj, greenlet.greenlet) and not obj.dead and obj.parent is not None
    )


# -- no patching ----------------------------------------------------------------


def test_runs_without_monkey_patching() -> None:
    if os.environ.get("SUBAGENTS_MONKEYPATCHED_RUN") == "1":
        assert MONKEYPATCHED
        pytest.skip("this pass runs monkey-patched on purpose")
    assert gevent.monkey.is_module_patched("threading") is False
    assert gevent.monkey.is_module_patched("socket") is False
    assert gevent.monkey.is_module_patched("time") is False


# -- tell / ask / proxy / stop --------------------------------------------------


def test_ask_returns_the_reply() -> None:
    ref = Recorder.start()
    assert ref.ask("hello") == "hello"
    assert ref.stop() is True


def test_ask_without_block_returns_a_gevent_future() -> None:
    ref = Recorder.start()
    future = ref.ask("x", block=False)
    assert isinstance(future, GeventFuture)
    assert future.get(timeout=5) == "x"
    ref.stop()


def test_tells_are_processed_in_order() -> None:
    events: list[str] = []
    ref = Recorder.start(events)
    for i in range(100):
        ref.tell(i)
    ref.ask("end")
    assert events == ["start", *(f"got {i!r}" for i in range(100)), "got 'end'"]
    ref.stop()


def test_proxy_calls_and_attributes() -> None:
    proxy = Recorder.start().proxy()
    assert proxy.add(2).get() == 2
    assert proxy.add(3).get() == 5
    assert proxy.value.get() == 5
    proxy.value = 10
    assert proxy.value.get() == 10
    proxy.actor_ref.stop()


def test_lifecycle_hooks_run_in_order() -> None:
    events: list[str] = []
    ref = Recorder.start(events)
    ref.tell("a")
    ref.stop()
    assert events == ["start", "got 'a'", "stop"]
    assert not ref.is_alive()


def test_messages_sent_before_stop_are_processed() -> None:
    events: list[str] = []
    gate = gevent.event.Event()
    ref = Recorder.start(events)
    ref.tell({"wait": gate})
    ref.tell("queued")
    stopped = ref.stop(block=False)
    gate.set()
    assert stopped.get(timeout=5) is True
    assert events[-2:] == ["got 'queued'", "stop"]


def test_stopped_actor_raises_actor_dead_error() -> None:
    ref = Recorder.start()
    ref.stop()
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("late")
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("late")
    assert ref.stop() is False


def test_messages_queued_behind_stop_get_actor_dead_error() -> None:
    gate = gevent.event.Event()
    ref = Recorder.start()
    ref.tell({"wait": gate})
    stopping = ref.stop(block=False)
    late = ref.ask("after stop", block=False)
    gate.set()
    assert stopping.get(timeout=5) is True
    with pytest.raises(pykka.ActorDeadError):
        late.get(timeout=5)


def test_exception_in_ask_propagates_and_actor_survives(caplog: pytest.LogCaptureFixture) -> None:
    proxy = Recorder.start().proxy()
    with caplog.at_level(logging.INFO, logger="pykka"), pytest.raises(ValueError, match="boom"):
        proxy.fail().get(timeout=5)
    assert proxy.add(1).get(timeout=5) == 1
    proxy.actor_ref.stop()


def test_exception_in_tell_calls_on_failure_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    failures: list[BaseException | None] = []
    done = gevent.event.Event()

    class Fragile(GeventActor):
        def on_receive(self, message: Any) -> None:
            raise RuntimeError(message)

        def on_failure(self, exc_type: Any, exc_value: Any, tb: Any) -> None:
            failures.append(exc_value)
            done.set()

    ref = Fragile.start()
    with caplog.at_level(logging.ERROR, logger="pykka"):
        ref.tell("bad")
        assert done.wait(5)
    assert [str(f) for f in failures] == ["bad"]
    assert any("Unhandled exception" in r.getMessage() for r in caplog.records)
    gevent.sleep(0)  # let the greenlet return after on_failure
    assert not ref.is_alive()
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is None


def test_on_start_failure_stops_the_actor(caplog: pytest.LogCaptureFixture) -> None:
    class BadStart(GeventActor):
        def on_start(self) -> None:
            raise RuntimeError("no start")

    with caplog.at_level(logging.ERROR, logger="pykka"):
        ref = BadStart.start()
        with pytest.raises(pykka.ActorDeadError):
            ref.ask("x", timeout=5)
    assert not ref.is_alive()


def test_killing_an_idle_actor_greenlet_stops_the_actor() -> None:
    # (Killed while handling a message, pykka treats the GreenletExit like any
    # BaseException: it stops every actor. Use stop(), not gevent.kill.)
    events: list[str] = []
    ref = Recorder.start(events)
    assert ref.ask("warm") == "warm"  # parked in its inbox now
    actor = ref._actor_weakref()
    assert actor is not None
    glet = actor._actor_greenlet
    del actor
    gevent.kill(glet)
    gevent.sleep(0)
    assert glet.dead
    assert not ref.is_alive()
    assert events == ["start", "got 'warm'", "stop"]
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is None
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("late")


def test_actor_asks_another_actor_cooperatively() -> None:
    class Asker(GeventActor):
        def __init__(self, other: pykka.ActorRef[Any]) -> None:
            super().__init__()
            self.other = other

        def on_receive(self, message: Any) -> Any:
            return ("via", self.other.ask(message, timeout=5))

    inner = Recorder.start()
    outer = Asker.start(inner)
    assert outer.ask("q", timeout=5) == ("via", "q")
    outer.stop()
    inner.stop()


def test_actor_stopped_is_cooperative_event() -> None:
    ref = Recorder.start()
    assert isinstance(ref.actor_stopped, gevent.event.Event)
    waiter = gevent.spawn(ref.actor_stopped.wait, 5)
    ref.stop()
    assert waiter.get(timeout=5) is True


# -- futures ----------------------------------------------------------------------


def test_future_get_timeout_raises_pykka_timeout() -> None:
    future: GeventFuture[int] = GeventFuture()
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0.01)
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0)


def test_future_set_and_get_repeatedly() -> None:
    future: GeventFuture[int] = GeventFuture()
    future.set(7)
    assert future.get() == 7
    assert future.get(timeout=0) == 7


def test_future_set_twice_raises_full() -> None:
    future: GeventFuture[int] = GeventFuture()
    future.set(1)
    with pytest.raises(queue.Full):
        future.set(2)
    with pytest.raises(queue.Full):
        future.set_exception((ValueError, ValueError("x"), None))


def test_future_exception_is_reraised_with_traceback() -> None:
    future: GeventFuture[int] = GeventFuture()
    try:
        raise KeyError("k")
    except KeyError:
        future.set_exception()
    with pytest.raises(KeyError) as info:
        future.get()
    assert info.traceback[-1].name == "test_future_exception_is_reraised_with_traceback"
    with pytest.raises(KeyError):  # again: a future can be read many times
        future.get()


def test_future_exception_type_only() -> None:
    future: GeventFuture[int] = GeventFuture()
    future.set_exception((ValueError, None, None))
    with pytest.raises(ValueError):
        future.get()


def test_future_get_hook() -> None:
    future: GeventFuture[int] = GeventFuture()
    seen: list[float | None] = []

    def hook(timeout: float | None) -> int:
        seen.append(timeout)
        return 42

    future.set_get_hook(hook)
    assert future.get(timeout=3) == 42
    assert future.get() == 42  # hook result is cached
    assert seen == [3]
    with pytest.raises(queue.Full):
        future.set(1)
    done: GeventFuture[int] = GeventFuture()
    done.set(1)
    with pytest.raises(queue.Full):
        done.set_get_hook(hook)


def test_future_map_filter_reduce_join_get_all() -> None:
    a: GeventFuture[Any] = GeventFuture()
    b: GeventFuture[Any] = GeventFuture()
    c: GeventFuture[Any] = GeventFuture()
    mapped = a.map(lambda v: v * 2)
    filtered = b.filter(lambda v: v > 2)
    reduced = b.reduce(lambda x, y: x + y, 100)
    joined = a.join(b, c)
    assert isinstance(mapped, GeventFuture)
    a.set(21)
    b.set([1, 2, 3, 4])
    c.set("c")
    assert mapped.get(timeout=1) == 42
    assert filtered.get(timeout=1) == [3, 4]
    assert reduced.get(timeout=1) == 110
    assert joined.get(timeout=1) == [21, [1, 2, 3, 4], "c"]
    assert list(pykka.get_all([a, c], timeout=1)) == [21, "c"]


def test_get_all_from_actors_and_timeout() -> None:
    refs = [Recorder.start() for _ in range(5)]
    futures = [ref.ask(i, block=False) for i, ref in enumerate(refs)]
    assert list(pykka.get_all(futures, timeout=5)) == [0, 1, 2, 3, 4]
    with pytest.raises(pykka.Timeout):
        pykka.get_all([GeventFuture()], timeout=0.01)
    for ref in refs:
        ref.stop()


def test_future_set_in_a_greenlet_wakes_the_waiter() -> None:
    future: GeventFuture[str] = GeventFuture()
    setter = gevent.spawn(future.set, "later")
    assert future.get(timeout=5) == "later"
    setter.join()


def test_future_await() -> None:
    future: GeventFuture[int] = GeventFuture()
    future.set(5)
    it = future.__await__()
    next(it)
    with pytest.raises(StopIteration) as stop:
        next(it)
    assert stop.value.value == 5


# -- across OS threads -------------------------------------------------------------


def test_os_thread_without_hub_asks_a_gevent_actor(start_os_thread: Any) -> None:
    ref = Recorder.start()
    done: GeventFuture[Any] = GeventFuture()

    def in_thread() -> None:
        # No hub here: the reply is awaited on a native lock; the result goes back
        # to the main greenlet through a future set from this foreign thread.
        assert current_backend() is THREADING
        try:
            done.set(ref.ask("from a thread", timeout=5))
        except BaseException:
            done.set_exception()

    thread = start_os_thread(in_thread)
    assert done.get(timeout=5) == "from a thread"
    assert thread.join(5)
    ref.stop()


def test_foreign_thread_tell_wakes_a_parked_actor(start_os_thread: Any) -> None:
    events: list[str] = []
    got_all = gevent.event.AsyncResult()

    class Counter(GeventActor):
        def on_receive(self, message: Any) -> None:
            events.append(message)
            if len(events) == 50:
                got_all.set(True)

    ref = Counter.start()
    ref.ask("warm")  # parked in its inbox now
    events.clear()
    thread = start_os_thread(lambda: [ref.tell(i) for i in range(50)])
    assert got_all.get(timeout=5) is True
    assert events == list(range(50))
    assert thread.join(5)
    ref.stop()


# -- scale and memory --------------------------------------------------------------


def test_ten_thousand_actors_start_and_stop_without_leaking_greenlets() -> None:
    before = _live_greenlets()
    refs = [Recorder.start() for _ in range(10_000)]
    assert len(pykka.ActorRegistry.get_all()) == 10_000
    futures = [ref.ask(i, block=False) for i, ref in enumerate(refs)]
    assert list(pykka.get_all(futures, timeout=30)) == list(range(10_000))
    stops = [ref.stop(block=False) for ref in refs]
    assert all(pykka.get_all(stops, timeout=30))
    gevent.sleep(0)
    assert pykka.ActorRegistry.get_all() == []
    assert _live_greenlets() <= before


def test_idle_actor_memory_is_bounded() -> None:
    # Allocations traced by tracemalloc (including each parked greenlet's saved
    # stack) per idle, started actor. Target: 16 KiB.
    class Idle(GeventActor):
        pass

    warm = Idle.start()
    warm.ask(None)
    warm.stop()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        refs = [Idle.start() for _ in range(1000)]
        gevent.sleep(0)  # every loop starts and parks in its inbox
        per_actor = (tracemalloc.get_traced_memory()[0] - start) / len(refs)
    finally:
        tracemalloc.stop()
    for ref in refs:
        ref.stop()
    assert per_actor <= 16 * 1024, per_actor


# -- the hub never stalls on run_blocking ------------------------------------------


def _max_tick_gap(work: Any) -> float:
    ticks: list[float] = []
    stop = gevent.event.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            gevent.sleep(0.005)

    glet = gevent.spawn(ticker)
    gevent.sleep(0)
    try:
        work()
    finally:
        stop.set()
        glet.join(5)
    assert len(ticks) >= 2
    return max(b - a for a, b in itertools.pairwise(ticks))


def test_run_blocking_sleep_does_not_stall_the_hub() -> None:
    blocking_sleep = gevent.monkey.get_original("time", "sleep")
    gap = _max_tick_gap(lambda: GEVENT.run_blocking(blocking_sleep, 0.2))
    assert gap < 0.1, gap


def test_run_blocking_sqlite_commit_does_not_stall_the_hub(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"

    def write() -> int:
        conn = sqlite3.connect(path)
        try:
            conn.execute("create table if not exists t (x blob)")
            with conn:
                conn.executemany("insert into t values (?)", [(b"x" * 512,)] * 2000)
            return int(conn.execute("select count(*) from t").fetchone()[0])
        finally:
            conn.close()

    results: list[int] = []
    gap = _max_tick_gap(lambda: results.append(GEVENT.run_blocking(write)))
    assert results == [2000]
    assert gap < 0.1, gap


def test_actor_using_run_blocking_leaves_other_actors_responsive() -> None:
    gate = native_allocate_lock()
    gate.acquire()
    started = gevent.event.Event()

    class Slow(GeventActor):
        def on_receive(self, message: Any) -> str:
            started.set()
            # Holds a threadpool worker until the test opens the gate.
            assert GEVENT.run_blocking(gate.acquire, True, 5)
            return "slow done"

    slow = Slow.start()
    fast = Recorder.start()
    slow_reply = slow.ask("go", block=False)
    assert started.wait(5)
    assert fast.ask("ping", timeout=5) == "ping"
    with pytest.raises(pykka.Timeout):
        slow_reply.get(timeout=0)
    gate.release()
    assert slow_reply.get(timeout=5) == "slow done"
    slow.stop()
    fast.stop()
