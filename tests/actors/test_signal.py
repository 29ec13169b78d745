"""AbortController / AbortSignal on both backends, across tasks and OS threads."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

import gevent
import gevent.monkey
import pytest
from subagents.actors._kernel._backend import GEVENT, Backend
from subagents.actors._kernel._signal import AbortController, AbortSignal
from subagents.protocol import ErrorCode, SubagentError

_native_lock = gevent.monkey.get_original("_thread", "allocate_lock")


def _listener_count(signal: AbortSignal) -> int:
    listeners = signal._listeners
    return 0 if listeners is None else len(listeners)


def _until(predicate: Callable[[], bool], pause: Callable[[float], object]) -> None:
    """Poll a condition (not a duration) with the caller's own way of pausing."""
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in 10s"
        pause(0.001)


def _native_pause(seconds: float) -> None:
    # Sleeps an OS thread without touching gevent, patched or not.
    lock = _native_lock()
    lock.acquire()
    lock.acquire(True, seconds)


# -- state ------------------------------------------------------------------------


def test_fresh_signal_is_not_aborted() -> None:
    signal = AbortController().signal
    assert signal.aborted is False
    assert signal.reason is None
    signal.raise_if_aborted()
    assert "pending" in repr(signal)


def test_abort_sets_reason_and_first_reason_wins() -> None:
    controller = AbortController()
    controller.abort("first")
    controller.abort("second")
    assert controller.signal.aborted is True
    assert controller.signal.reason == "first"
    assert "first" in repr(controller)


def test_abort_without_reason() -> None:
    controller = AbortController()
    controller.abort()
    assert controller.signal.aborted is True
    assert controller.signal.reason is None


def test_raise_if_aborted_raises_cancelled_with_the_reason_as_hint() -> None:
    controller = AbortController()
    controller.abort({"why": "user"})
    with pytest.raises(SubagentError) as info:
        controller.signal.raise_if_aborted()
    assert info.value.code == ErrorCode.CANCELLED
    assert info.value.hint == {"why": "user"}
    assert info.value.__cause__ is None


def test_raise_if_aborted_chains_an_exception_reason() -> None:
    cause = TimeoutError("deadline")
    signal = AbortSignal.aborted_with(cause)
    with pytest.raises(SubagentError) as info:
        signal.raise_if_aborted()
    assert info.value.code == ErrorCode.CANCELLED
    assert info.value.hint is cause
    assert info.value.__cause__ is cause


# -- listeners --------------------------------------------------------------------


def test_listeners_run_once_each_in_order_with_the_reason() -> None:
    controller = AbortController()
    calls: list[tuple[str, Any]] = []
    controller.signal.add_listener(lambda r: calls.append(("a", r)))
    controller.signal.add_listener(lambda r: calls.append(("b", r)))
    controller.abort("stop")
    controller.abort("again")
    assert calls == [("a", "stop"), ("b", "stop")]
    assert _listener_count(controller.signal) == 0


def test_listener_added_after_abort_runs_at_once() -> None:
    controller = AbortController()
    controller.abort("late")
    calls: list[Any] = []
    remove = controller.signal.add_listener(calls.append)
    assert calls == ["late"]
    remove()  # harmless


def test_signal_is_aborted_when_listeners_run() -> None:
    controller = AbortController()
    seen: list[bool] = []
    controller.signal.add_listener(lambda _r: seen.append(controller.signal.aborted))
    controller.abort()
    assert seen == [True]


def test_remover_detaches_the_listener() -> None:
    controller = AbortController()
    calls: list[str] = []
    remove_a = controller.signal.add_listener(lambda _r: calls.append("a"))
    controller.signal.add_listener(lambda _r: calls.append("b"))
    remove_a()
    remove_a()  # idempotent
    controller.abort()
    assert calls == ["b"]


def test_same_function_added_twice_runs_twice() -> None:
    controller = AbortController()
    calls: list[Any] = []
    controller.signal.add_listener(calls.append)
    remove = controller.signal.add_listener(calls.append)
    remove()
    controller.abort(1)
    assert calls == [1]


def test_raising_listener_is_logged_and_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    controller = AbortController()
    calls: list[str] = []

    def bad(_reason: Any) -> None:
        raise RuntimeError("listener broke")

    controller.signal.add_listener(lambda _r: calls.append("before"))
    controller.signal.add_listener(bad)
    controller.signal.add_listener(lambda _r: calls.append("after"))
    with caplog.at_level(logging.ERROR, logger="subagents"):
        controller.abort()
    assert calls == ["before", "after"]
    [record] = caplog.records
    assert record.name == "subagents"
    assert "listener" in record.getMessage()
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "listener broke"


def test_raising_listener_added_after_abort_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    signal = AbortSignal.aborted_with("x")
    with caplog.at_level(logging.ERROR, logger="subagents"):
        signal.add_listener(lambda _r: 1 / 0)
    assert len(caplog.records) == 1


def test_listener_runs_in_the_aborting_task(backend: Backend, run_in: Callable[..., Any]) -> None:
    controller = AbortController()
    where: list[str] = []
    controller.signal.add_listener(lambda _r: where.append(_here()))
    aborter = run_in(backend, lambda: (controller.abort(), _here())[1])
    assert where == [aborter]


def _here() -> str:
    import threading

    import greenlet

    return f"{threading.get_ident()}:{id(greenlet.getcurrent())}"


# -- wait -------------------------------------------------------------------------


def test_wait_times_out(backend: Backend, run_in: Callable[..., Any]) -> None:
    signal = AbortController().signal
    assert run_in(backend, signal.wait, 0.01) is False
    assert run_in(backend, signal.wait, 0) is False
    assert _listener_count(signal) == 0  # the waiter cleaned up after itself


def test_wait_returns_at_once_when_aborted(backend: Backend, run_in: Callable[..., Any]) -> None:
    signal = AbortSignal.aborted_with("done")
    assert run_in(backend, signal.wait) is True
    assert run_in(backend, signal.wait, 0) is True


def test_wait_wakes_on_abort_from_another_task(backend: Backend) -> None:
    controller = AbortController()
    woke = backend.future()
    waiter = backend.spawn(lambda: woke.set(controller.signal.wait(10)))
    _until(lambda: _listener_count(controller.signal) == 1, backend.sleep)
    aborter = backend.spawn(controller.abort, "go")
    assert woke.get(timeout=10) is True
    assert waiter.join(5)
    assert aborter.join(5)
    assert _listener_count(controller.signal) == 0


def test_wait_in_a_task_wakes_on_abort_from_an_os_thread(
    backend: Backend, start_os_thread: Any
) -> None:
    controller = AbortController()
    woke = backend.future()
    waiter = backend.spawn(lambda: woke.set(controller.signal.wait(10)))

    def abort_when_waited_on() -> None:
        _until(lambda: _listener_count(controller.signal) == 1, _native_pause)
        controller.abort("from an OS thread")

    thread = start_os_thread(abort_when_waited_on)
    assert woke.get(timeout=10) is True
    assert waiter.join(5)
    assert thread.join(5)


def test_wait_in_the_main_greenlet_wakes_on_abort_from_an_os_thread(
    start_os_thread: Any,
) -> None:
    gevent.get_hub()  # the calling thread runs a hub: wait() must be cooperative
    controller = AbortController()

    def abort_when_waited_on() -> None:
        _until(lambda: _listener_count(controller.signal) == 1, _native_pause)
        controller.abort("cross-thread")

    thread = start_os_thread(abort_when_waited_on)
    assert controller.signal.wait(10) is True
    assert controller.signal.reason == "cross-thread"
    assert thread.join(5)


def test_wait_in_an_os_thread_wakes_on_abort_from_the_main_thread(start_os_thread: Any) -> None:
    controller = AbortController()
    thread = start_os_thread(controller.signal.wait, 10)
    _until(lambda: _listener_count(controller.signal) == 1, _native_pause)
    controller.abort()
    assert thread.result(10) is True


@pytest.mark.backend_specific
def test_gevent_wait_wakes_on_abort_from_a_threadpool_worker() -> None:
    controller = AbortController()
    woke = GEVENT.future()
    waiter = GEVENT.spawn(lambda: woke.set(controller.signal.wait(10)))
    GEVENT.sleep(0)
    assert _listener_count(controller.signal) == 1
    GEVENT.run_blocking(controller.abort, "from the pool")
    assert woke.get(timeout=10) is True
    assert waiter.join(5)


def test_many_waiters_all_wake(backend: Backend) -> None:
    controller = AbortController()
    results = [backend.future() for _ in range(20)]
    tasks = [backend.spawn(lambda f=f: f.set(controller.signal.wait(10))) for f in results]
    _until(lambda: _listener_count(controller.signal) == 20, backend.sleep)
    controller.abort()
    assert [f.get(timeout=10) for f in results] == [True] * 20
    assert all(t.join(5) for t in tasks)


# -- never / aborted_with / any ---------------------------------------------------


def test_never(backend: Backend, run_in: Callable[..., Any]) -> None:
    never = AbortSignal.never()
    assert never is AbortSignal.never()
    assert never.aborted is False
    calls: list[Any] = []
    never.add_listener(calls.append)()
    assert _listener_count(never) == 0
    assert run_in(backend, never.wait, 0.01) is False
    never._abort("cannot")  # no controller exposes it; even so, it stays put
    assert never.aborted is False
    assert "never" in repr(never)


def test_aborted_with() -> None:
    signal = AbortSignal.aborted_with("r")
    assert signal.aborted is True
    assert signal.reason == "r"
    assert signal is not AbortSignal.aborted_with("r")


def test_any_aborts_with_the_first_aborting_input() -> None:
    a, b, c = AbortController(), AbortController(), AbortController()
    combined = AbortSignal.any(a.signal, b.signal, c.signal)
    calls: list[Any] = []
    combined.add_listener(calls.append)
    assert combined.aborted is False
    b.abort("b first")
    a.abort("a second")
    assert combined.aborted is True
    assert combined.reason == "b first"
    assert calls == ["b first"]
    # detached from every input once done
    assert _listener_count(a.signal) == 0
    assert _listener_count(c.signal) == 0


def test_any_with_an_aborted_input_is_aborted_at_once() -> None:
    live = AbortController()
    combined = AbortSignal.any(
        live.signal, AbortSignal.aborted_with("x"), AbortSignal.aborted_with("y")
    )
    assert combined.aborted is True
    assert combined.reason == "x"
    assert _listener_count(live.signal) == 0


def test_any_skips_never_and_collapses() -> None:
    never = AbortSignal.never()
    assert AbortSignal.any() is never
    assert AbortSignal.any(never, never) is never
    only = AbortController().signal
    assert AbortSignal.any(never, only, only) is only


def test_any_detaches_from_inputs_when_collected() -> None:
    long_lived = AbortController()
    other = AbortController()
    for _ in range(100):
        combined = AbortSignal.any(long_lived.signal, other.signal)
        del combined
    gc.collect()
    assert _listener_count(long_lived.signal) == 0
    assert _listener_count(other.signal) == 0


def test_any_of_any() -> None:
    a, b, c = AbortController(), AbortController(), AbortController()
    nested = AbortSignal.any(AbortSignal.any(a.signal, b.signal), c.signal)
    b.abort("deep")
    assert nested.aborted is True
    assert nested.reason == "deep"


def test_any_wait(backend: Backend) -> None:
    a, b = AbortController(), AbortController()
    combined = AbortSignal.any(a.signal, b.signal)
    woke = backend.future()
    waiter = backend.spawn(lambda: woke.set(combined.wait(10)))
    _until(lambda: _listener_count(combined) >= 2, backend.sleep)  # its own + waiter
    backend.spawn(b.abort, "b").join(5)
    assert woke.get(timeout=10) is True
    assert waiter.join(5)


# -- races ------------------------------------------------------------------------


def test_concurrent_aborts_from_tasks_call_each_listener_once(backend: Backend) -> None:
    for _ in range(200):
        controller = AbortController()
        counts = [0, 0, 0]
        reasons: list[Any] = []
        for i in range(3):
            controller.signal.add_listener(
                lambda r, i=i, counts=counts, reasons=reasons: (
                    counts.__setitem__(i, counts[i] + 1),
                    reasons.append(r),
                )
            )
        go = backend.event()

        def racer(n: int, go: Any = go, controller: AbortController = controller) -> None:
            if go.wait(5):
                controller.abort(n)

        tasks = [backend.spawn(racer, n) for n in (1, 2)]
        go.set()
        assert all(t.join(5) for t in tasks)
        assert counts == [1, 1, 1]
        assert len(set(reasons)) == 1
        assert controller.signal.reason in (1, 2)
        assert reasons[0] == controller.signal.reason


def test_concurrent_aborts_from_os_threads_call_each_listener_once(start_os_thread: Any) -> None:
    for _ in range(200):
        controller = AbortController()
        counts = [0, 0]
        for i in (0, 1):
            controller.signal.add_listener(
                lambda _r, i=i, counts=counts: counts.__setitem__(i, counts[i] + 1)
            )
        gate = _native_lock()
        gate.acquire()

        def racer(reason: str, gate: Any = gate, controller: AbortController = controller) -> None:
            gate.acquire(True, 5)
            gate.release()
            controller.abort(reason)

        threads = [start_os_thread(racer, "x"), start_os_thread(racer, "y")]
        gate.release()
        assert all(t.join(5) for t in threads)
        assert counts == [1, 1]
        assert controller.signal.reason in ("x", "y")
