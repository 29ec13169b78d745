"""Every Backend method on both runtimes, get_backend/current_backend, and the
leak guard in tests/conftest.py (run on a scratch suite in a subprocess)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import gevent.monkey
import pykka
import pytest
from subagents.actors._kernel._backend import (
    GEVENT,
    THREADING,
    Backend,
    current_backend,
    get_backend,
)
from subagents.actors._kernel._gevent import GeventActor, GeventFuture
from subagents.actors._kernel._threadinbox import ThreadActor
from subagents.protocol import ErrorCode, SubagentError

MONKEYPATCHED = gevent.monkey.is_module_patched("threading")


# -- identity ---------------------------------------------------------------------


def test_names_and_actor_classes(backend: Backend) -> None:
    assert backend.name in {"threading", "gevent"}
    expected = ThreadActor if backend.name == "threading" else GeventActor
    assert backend.actor_class is expected
    assert issubclass(backend.actor_class, pykka.ThreadingActor) == (backend.name == "threading")
    assert repr(backend) == f"<Backend {backend.name}>"


def test_get_backend_resolves_names_and_instances(backend: Backend) -> None:
    assert get_backend(backend.name) is backend
    assert get_backend(backend) is backend
    assert get_backend("threading") is THREADING
    assert get_backend("gevent") is GEVENT


@pytest.mark.parametrize("spec", ["asyncio", "", "Threading", None, 42])
def test_get_backend_rejects_anything_else(spec: Any) -> None:
    with pytest.raises(SubagentError) as info:
        get_backend(spec)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert info.value.hint == {"backend": repr(spec)}


# -- futures ----------------------------------------------------------------------


def test_future(backend: Backend) -> None:
    future = backend.future()
    expected = pykka.ThreadingFuture if backend.name == "threading" else GeventFuture
    assert isinstance(future, expected)
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0.01)
    future.set("v")
    assert future.get(timeout=0) == "v"


def test_future_set_from_a_task(backend: Backend) -> None:
    future = backend.future()
    task = backend.spawn(future.set, "from task")
    assert future.get(timeout=5) == "from task"
    assert task.join(5)


def test_actor_class_round_trip(backend: Backend) -> None:
    class Echo(backend.actor_class):  # type: ignore[name-defined,misc]
        def on_receive(self, message: Any) -> Any:
            return message

    ref = Echo.start()
    assert ref.ask("ping", timeout=5) == "ping"
    assert ref.stop(timeout=5) is True


# -- events -----------------------------------------------------------------------


def test_event_set_clear_wait(backend: Backend) -> None:
    event = backend.event()
    assert not event.is_set()
    assert event.wait(0.01) is False
    event.set()
    assert event.is_set()
    assert event.wait() is True
    assert event.wait(0) is True
    event.clear()
    assert not event.is_set()
    assert event.wait(0) is False


def test_event_set_by_a_task_wakes_the_waiter(backend: Backend) -> None:
    ready = backend.event()
    go = backend.event()

    def task() -> None:
        ready.set()
        assert go.wait(5)

    handle = backend.spawn(task)
    assert ready.wait(5)
    go.set()
    assert handle.join(5)
    assert handle.exception is None


def test_event_set_from_another_os_thread(backend: Backend, start_os_thread: Any) -> None:
    event = backend.event()
    thread = start_os_thread(event.set)
    assert event.wait(5) is True
    assert thread.join(5)


# -- locks ------------------------------------------------------------------------


def test_lock_is_not_reentrant(backend: Backend) -> None:
    lock = backend.lock()
    assert lock.acquire() is True
    assert lock.acquire(blocking=False) is False
    assert lock.acquire(timeout=0.01) is False
    lock.release()
    with lock:
        assert lock.acquire(False) is False
    assert lock.acquire(True, -1) is True
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()


def test_lock_excludes_other_tasks(backend: Backend) -> None:
    lock = backend.lock()
    inside = backend.event()
    release = backend.event()
    results: list[str] = []

    def holder() -> None:
        with lock:
            inside.set()
            assert release.wait(5)
            results.append("holder")

    def contender() -> None:
        with lock:
            results.append("contender")

    first = backend.spawn(holder)
    assert inside.wait(5)
    assert lock.acquire(blocking=False) is False
    second = backend.spawn(contender)
    assert second.join(0.01) is False  # blocked on the lock
    release.set()
    assert first.join(5)
    assert second.join(5)
    assert results == ["holder", "contender"]


def test_lock_protects_a_read_modify_write(backend: Backend) -> None:
    lock = backend.lock()
    counter = [0]

    def bump() -> None:
        for _ in range(200):
            with lock:
                value = counter[0]
                backend.sleep(0)  # invite a switch inside the critical section
                counter[0] = value + 1

    tasks = [backend.spawn(bump) for _ in range(4)]
    assert all(t.join(10) for t in tasks)
    assert counter[0] == 800


def test_rlock_is_reentrant_for_its_owner_only(backend: Backend) -> None:
    rlock = backend.rlock()
    assert rlock.acquire()
    assert rlock.acquire(blocking=False)
    with rlock:
        pass
    seen: list[bool] = []
    other = backend.spawn(lambda: seen.append(rlock.acquire(timeout=0.01)))
    assert other.join(5)
    assert seen == [False]
    rlock.release()
    rlock.release()
    other = backend.spawn(lambda: seen.append(rlock.acquire(blocking=False)) or rlock.release())
    assert other.join(5)
    assert seen == [False, True]


# -- tasks ------------------------------------------------------------------------


def test_spawn_runs_at_once_with_args_and_name(backend: Backend) -> None:
    got = backend.future()
    task = backend.spawn(lambda a, *, b: got.set((a, b)), 1, b=2, name="worker-x")
    assert got.get(timeout=5) == (1, 2)
    assert task.join(5) is True
    assert task.join() is True
    assert not task.is_alive()
    assert task.name == "worker-x"
    assert task.exception is None
    assert "worker-x" in repr(task)


def test_spawn_default_name(backend: Backend) -> None:
    def some_function() -> None:
        pass

    task = backend.spawn(some_function)
    assert task.join(5)
    assert task.name.startswith("some_function-")


def test_join_times_out_while_the_task_runs(backend: Backend) -> None:
    go = backend.event()
    task = backend.spawn(go.wait, 5)
    assert task.is_alive()
    assert task.join(0.01) is False
    go.set()
    assert task.join(5) is True
    assert not task.is_alive()


def test_spawn_logs_and_keeps_the_exception(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    error = ValueError("task failed")

    def boom() -> None:
        raise error

    with caplog.at_level(logging.ERROR, logger="subagents"):
        task = backend.spawn(boom, name="boomer")
        assert task.join(5)
    assert task.exception is error
    assert [r.getMessage() for r in caplog.records] == ["Task boomer failed"]
    assert caplog.records[0].exc_info is not None


# -- run_blocking and sleep -------------------------------------------------------


def test_run_blocking_returns_the_result(backend: Backend) -> None:
    assert backend.run_blocking(lambda a, b=0: a + b, 2, b=3) == 5


def test_run_blocking_propagates_the_exception_unchanged(backend: Backend) -> None:
    error = OSError(28, "No space left on device")

    def fail() -> None:
        raise error

    with pytest.raises(OSError) as info:
        backend.run_blocking(fail)
    assert info.value is error


def test_run_blocking_inside_a_task(backend: Backend, run_in: Callable[..., Any]) -> None:
    assert run_in(backend, backend.run_blocking, sum, [1, 2, 3]) == 6


def test_run_blocking_offloads_where_a_hub_could_stall() -> None:
    native_ident = gevent.monkey.get_original("_thread", "get_ident")
    here = native_ident()
    gevent.get_hub()  # a hub in this thread: GEVENT offloads to its threadpool
    assert GEVENT.run_blocking(native_ident) != here
    # THREADING calls directly, except under monkey-patching where its "threads"
    # are greenlets of this hub.
    assert (THREADING.run_blocking(native_ident) != here) is MONKEYPATCHED


def test_gevent_run_blocking_without_a_hub_calls_directly(start_os_thread: Any) -> None:
    native_ident = gevent.monkey.get_original("_thread", "get_ident")
    thread = start_os_thread(lambda: GEVENT.run_blocking(native_ident) == native_ident())
    assert thread.result(5) is True


def test_sleep_waits_at_least_its_duration(backend: Backend) -> None:
    """``sleep(d)`` returns after ``d`` seconds or more (a lower bound, so no timing
    flake), ``sleep(0)`` returns at once, and neither returns a value."""
    clock = time.monotonic
    start = clock()
    assert backend.sleep(0) is None
    assert backend.sleep(0.02) is None
    # libev caches the loop's time at each iteration: allow it one millisecond.
    assert clock() - start >= 0.019


def test_gevent_sleep_lets_other_greenlets_run() -> None:
    ran: list[int] = []
    task = GEVENT.spawn(ran.append, 1)
    GEVENT.sleep(0)
    assert ran == [1]
    assert task.join(5)


# -- current_backend --------------------------------------------------------------


def test_current_backend_in_a_thread_without_hub(start_os_thread: Any) -> None:
    assert start_os_thread(current_backend).result(5) is THREADING


def test_current_backend_in_a_greenlet(run_in: Callable[..., Any]) -> None:
    expected = THREADING if MONKEYPATCHED else GEVENT
    assert run_in(GEVENT, current_backend) is expected


def test_current_backend_in_a_thread_with_a_hub(start_os_thread: Any) -> None:
    def probe() -> tuple[Backend, Backend]:
        before = current_backend()
        hub = gevent.get_hub()
        try:
            return before, current_backend()
        finally:
            hub.destroy(destroy_loop=True)

    before, after = start_os_thread(probe).result(5)
    assert before is THREADING
    assert after is (THREADING if MONKEYPATCHED else GEVENT)


def test_current_backend_in_the_main_greenlet() -> None:
    gevent.get_hub()
    assert current_backend() is (THREADING if MONKEYPATCHED else GEVENT)


# -- the leak guard (tests/conftest.py) -------------------------------------------

LEAKY_SUITE = """
import threading
import gevent, gevent.event
import pykka
from subagents.actors._kernel._gevent import GeventActor

_keep = []

def test_clean():
    pass

def test_leaks_an_actor():
    class Left(GeventActor):
        pass
    Left.start()

def test_leaks_a_thread():
    stop = threading.Event()
    _keep.append(stop)
    threading.Thread(target=stop.wait, name="leaky-thread", daemon=True).start()

def test_leaks_a_greenlet():
    never = gevent.event.Event()
    _keep.append(never)
    glet = gevent.spawn_raw(never.wait)
    _keep.append(glet)
    gevent.sleep(0)

def test_failing_test_is_not_reported_twice():
    class Left(GeventActor):
        pass
    Left.start()
    raise AssertionError("the real failure")

def test_after_the_leaks_is_clean():
    pass

def test_zz_release():
    for item in _keep:
        if hasattr(item, "set"):
            item.set()
"""


@pytest.mark.skipif(MONKEYPATCHED, reason="threads are greenlets when patched")
def test_leak_guard_reports_actors_threads_and_greenlets(tmp_path: Path) -> None:
    shutil.copy(Path(__file__).parents[1] / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(LEAKY_SUITE))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rE",
            "-rf",
            "-o",
            "filterwarnings=error",
            "test_leaky.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "ERROR at teardown of test_leaks_an_actor" in out, out
    assert "actors still running: Left (urn:uuid:" in out, out
    assert "ERROR at teardown of test_leaks_a_thread" in out, out
    assert "threads still alive: leaky-thread" in out, out
    assert "ERROR at teardown of test_leaks_a_greenlet" in out, out
    assert "greenlets still alive:" in out, out
    assert "the real failure" in out, out
    assert "teardown of test_failing_test_is_not_reported_twice" not in out, out
    assert "1 failed, 6 passed, 3 errors" in out, out
