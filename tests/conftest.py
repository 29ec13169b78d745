"""Fixtures every test in the project uses.

* ``backend``: session-scoped, parametrised over ``threading`` and ``gevent`` (ids
  ``threading``/``gevent``); a test that takes it runs once per runtime.
* an autouse leak guard: after each test it stops every pykka actor still
  registered, and fails the test (an error at teardown) if an actor, an OS thread,
  a greenlet or a child process its body started outlived it (the process is
  killed: a worker left running used to fail a later test through its pipes).
  Details in :func:`_leak_guard`.
* ``run_in``: run a function in a task of a backend (a thread, or a greenlet of the
  calling thread's hub) and return its result or raise its exception.
* ``tiny_switch_interval``: the interpreter switches threads as often as it can
  while the test runs (a race test's window opens).
* ``start_os_thread``: a real OS thread, even under monkey-patching (where
  ``threading.Thread`` makes greenlets), for cross-thread tests.

On a hang, pytest's ``faulthandler_timeout`` dumps every thread's stack; ``kill
-USR1 <pid>`` dumps them on demand.

The Python subprocesses the tests start (SIGKILL points, several processes on one
store, the CLI, examples) keep their bytecode in a cache of the tests' own under
the system's temporary directory (``PYTHONPYCACHEPREFIX``), even where the
environment sets ``PYTHONDONTWRITEBYTECODE``: otherwise each of them compiles the
package from source again (about 0.1 s a process; a crash-replay and CLI subset
ran 140 s before, 100-109 s after with the cache cold, as in CI). Nothing is written
next to the sources.

``pytest`` runs in test workers (``pytest-xdist``, ``pyproject.toml``): a
worker sends its reports as UTF-8, so strings in them are made encodable first
(a turn that failed with a lone surrogate in its exception logs one).

This file imports only the runtime module it owns (``subagents.actors._kernel._backend``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import Any

import gevent
import gevent.monkey
import greenlet
import psutil
import pykka
import pytest
from gevent._hub_local import get_hub_if_exists
from gevent.hub import Hub
from subagents.actors._kernel._backend import Backend, get_backend

if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
    faulthandler.register(signal.SIGUSR1, all_threads=True)

MONKEYPATCHED = gevent.monkey.is_module_patched("threading")

if "PYTHONPYCACHEPREFIX" not in os.environ:  # a prefix somebody chose stays theirs
    os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(
        tempfile.gettempdir(), f"subagents-tests-pycache-{os.getuid()}"
    )
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

_native_start_thread = gevent.monkey.get_original("_thread", "start_new_thread")
_native_lock = gevent.monkey.get_original("_thread", "allocate_lock")

# Grace for threads that are already on their way out (a stopped ThreadingActor's
# thread returns right after replying to the stop): total, not per thread.
THREAD_GRACE_SECONDS = 2.0


# -- backends ---------------------------------------------------------------------


@pytest.fixture(scope="session", params=["threading", "gevent"], ids=["threading", "gevent"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """The runtime under test: ``THREADING`` or ``GEVENT``."""
    return get_backend(request.param)


# -- helpers ----------------------------------------------------------------------


class OsThread:
    """A handle on a native OS thread started by :func:`start_os_thread`."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._done = _native_lock()
        self._done.acquire()
        self.value: Any = None
        self.error: BaseException | None = None
        _native_start_thread(self._run, (fn, args))

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self.value = fn(*args)
        except BaseException as exc:
            self.error = exc
        finally:
            # A foreign thread that touched threading.current_thread() (logging
            # does) leaves a _DummyThread behind for ever; drop ours.
            dummy = threading._active.get(threading.get_ident())  # type: ignore[attr-defined]
            if isinstance(dummy, threading._DummyThread):  # type: ignore[attr-defined]
                threading._active.pop(threading.get_ident(), None)  # type: ignore[attr-defined]
            self._done.release()

    def join(self, timeout: float = 10.0) -> bool:
        """Wait on a native lock; True when the thread finished."""
        if self._done.acquire(True, timeout):
            self._done.release()
            return True
        return False

    def result(self, timeout: float = 10.0) -> Any:
        assert self.join(timeout), "OS thread did not finish"
        if self.error is not None:
            raise self.error
        return self.value


@pytest.fixture
def start_os_thread() -> Iterator[Callable[..., OsThread]]:
    """``start_os_thread(fn, *args) -> OsThread``: a real OS thread, joined at teardown.

    Joining from a greenlet blocks the hub: use it only when the thread cannot be
    waiting for that hub, or poll ``join(timeout=0)`` cooperatively.
    """
    started: list[OsThread] = []

    def start(fn: Callable[..., Any], *args: Any) -> OsThread:
        thread = OsThread(fn, args)
        started.append(thread)
        return thread

    yield start
    for thread in started:
        assert thread.join(10.0), "an OS thread started by the test did not finish"


@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    """Make the interpreter switch threads as often as it can, so that a switch
    lands inside an unlocked section: a race shows."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.fixture
def run_in() -> Callable[..., Any]:
    """``run_in(backend, fn, *args, timeout=10.0, **kw)``: run fn in a backend task.

    On gevent the task is a greenlet of the calling thread's hub, and the caller
    waits cooperatively, so the main greenlet can drive gevent code. Returns what
    ``fn`` returned; re-raises what it raised.
    """

    def run(
        backend: Backend, fn: Callable[..., Any], *args: Any, timeout: float = 10.0, **kwargs: Any
    ) -> Any:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as exc:
                box["error"] = exc

        task = backend.spawn(target, name=f"run_in-{getattr(fn, '__name__', 'fn')}")
        assert task.join(timeout), f"{fn!r} did not finish in {timeout}s on {backend.name}"
        if "error" in box:
            raise box["error"]
        return box.get("value")

    return run


# -- reports across processes ------------------------------------------------------


def _utf8_safe(value: Any) -> Any:
    """``value`` with every string made encodable as UTF-8 (a lone surrogate
    escaped as ``\\udXXX``), through lists, tuples and dicts."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {k: _utf8_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_utf8_safe(v) for v in value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report: Any) -> Generator[None, Any, Any]:
    # A test worker (``pytest -n``) sends its reports as UTF-8: a test whose
    # captured log holds a lone surrogate (a turn that failed with one in its
    # exception) would otherwise end the worker with an encoding error.
    data = yield
    return _utf8_safe(data)


# -- the leak guard ---------------------------------------------------------------

_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_CALL_REPORT] = report
    return report


#: Child processes the test body started and left running (set around the call).
_STARTED = pytest.StashKey[list[Any]]()

#: Seconds a process the test left may take to finish (one stopping as it ends).
PROCESS_GRACE_SECONDS = 5.0


#: Helpers ``multiprocessing`` starts once and keeps for the interpreter's life.
_SINGLETONS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _children() -> dict[int, Any]:
    """This process's running child processes (zombies, already ended, and
    ``multiprocessing``'s own helpers left out)."""
    found = {}
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(name in " ".join(child.cmdline()) for name in _SINGLETONS):
                continue
            found[child.pid] = child
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    # Only what the test body started: a session fixture's servers (Ray,
    # PostgreSQL) start during some test's setup and outlive it by design.
    before = _children()
    try:
        return (yield)
    finally:
        item.stash[_STARTED] = [p for pid, p in _children().items() if pid not in before]


def _ignored_thread_idents() -> set[int]:
    """gevent threadpool workers of this thread's hub: pooled for reuse, by design."""
    hub = get_hub_if_exists()
    pool = getattr(hub, "_threadpool", None) if hub is not None else None
    if pool is None:
        return set()
    return {
        ident
        for worker in list(getattr(pool, "_worker_greenlets", ()))
        if (ident := getattr(worker, "_thread_ident", None)) is not None
    }


def _live_threads() -> list[threading.Thread]:
    ignored = _ignored_thread_idents()
    return [
        t
        for t in threading.enumerate()
        if t.ident not in ignored
        # Threads threading did not start (C threads, _thread.start_new_thread, and
        # under monkey-patching raw greenlets that called current_thread(), as
        # logging does): they cannot be joined and CPython never drops them.
        and not isinstance(t, threading._DummyThread)  # type: ignore[attr-defined]
        # pytest-timeout's timer thread in its "thread" method (named after it).
        and not t.name.startswith("pytest_timeout")
    ]


def _is_infrastructure(glet: greenlet.greenlet) -> bool:
    # A thread's root greenlet (parent None), gevent hubs (one per thread that used
    # gevent, kept for reuse), and gevent threadpool worker greenlets (they live in
    # the pooled worker threads).
    return (
        glet.parent is None
        or isinstance(glet, Hub)
        or type(glet).__name__ in {"ThreadPoolWorker", "_WorkerGreenlet"}
    )


class _GreenletTracker:
    """Remembers every greenlet switched to in this (the main) thread.

    A ``greenlet.settrace`` hook costs well under a microsecond per switch, where a
    ``gc.get_objects()`` scan costs ~15 ms per test on this suite (~17 s of a 76 s
    run, measured). Any greenlet a test leaks here has been switched to at least
    once: it started, or it is started by draining the hub before counting. The
    trace is per thread, so greenlets of hubs in other OS threads are not seen.
    """

    def __init__(self) -> None:
        self.seen: weakref.WeakSet[greenlet.greenlet] = weakref.WeakSet()
        self._previous: Any = greenlet.settrace(self)

    def __call__(self, event: str, args: tuple[greenlet.greenlet, greenlet.greenlet]) -> None:
        if event in ("switch", "throw"):
            self.seen.add(args[1])
        if self._previous is not None:
            self._previous(event, args)

    def live(self) -> list[greenlet.greenlet]:
        return [g for g in list(self.seen) if not g.dead and not _is_infrastructure(g)]


_tracker = _GreenletTracker()


def _describe_greenlet(glet: greenlet.greenlet) -> str:
    run = getattr(glet, "_run", None) or getattr(glet, "run", None)
    frame = glet.gr_frame
    if frame is None:
        return f"{glet!r} run={run!r}"
    code = frame.f_code
    return f"{glet!r} run={run!r} at {code.co_qualname} ({code.co_filename}:{frame.f_lineno})"


def _drain_hub() -> None:
    # Let this thread's hub run what is already scheduled (wake-ups of greenlets
    # that are about to finish) before counting.
    if get_hub_if_exists() is not None:
        for _ in range(3):
            gevent.sleep(0)


class _OwnerFailures(logging.Handler):
    """Records an owner actor failing on a notice: an invariant of the runtime broke
    (the registry, the supervisor and the dispatcher log such a failure and go on,
    so without this a test would pass over it)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, str) and record.msg.startswith("%s failed on a %s notice"):
            self.failures.append(record.getMessage())


@pytest.fixture(autouse=True)
def _owners_never_fail() -> Iterator[None]:
    """Fail a test during which the registry, supervisor or dispatcher failed on a notice."""
    handler = _OwnerFailures()
    logger = logging.getLogger("subagents")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    assert not handler.failures, handler.failures


@pytest.fixture(autouse=True)
def _leak_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaks an actor, an OS thread or a greenlet.

    After the test (and after its other fixtures are torn down, this one being set
    up first): every actor in ``pykka.ActorRegistry`` is stopped, and its presence
    is a failure. A thread alive now that was not alive before is a leak once a
    bounded grace join (``THREAD_GRACE_SECONDS`` in total) has passed. A greenlet
    of the main thread that is neither dead nor alive before is a leak (greenlets
    are seen through a ``greenlet.settrace`` hook, see :class:`_GreenletTracker`;
    suspects are re-checked after ``gc.collect()`` so garbage does not count).

    Ignored, because they outlive tests by design or cannot be checked:
    * gevent threadpool worker threads and worker greenlets: gevent pools them for
      reuse by ``run_blocking``;
    * ``threading._DummyThread`` entries: threads ``threading`` did not start (raw
      ``_thread`` threads, C threads; under monkey-patching, raw greenlets that
      called ``current_thread()``). They cannot be joined and CPython 3.11 never
      removes them, so a finished one would look leaked for ever;
    * pytest-timeout's timer thread (``timeout_method = thread``);
    * gevent hubs and each thread's root greenlet: a hub stays with its thread.

    When the test itself failed, leaks are cleaned up but not reported again.
    """
    threads_before = set(_live_threads())
    greenlets_before: weakref.WeakSet[greenlet.greenlet] = weakref.WeakSet(_tracker.live())

    yield

    problems: list[str] = []

    leaked_actors = pykka.ActorRegistry.get_all()
    if leaked_actors:
        problems.append("actors still running: " + ", ".join(str(ref) for ref in leaked_actors))
        try:
            pykka.ActorRegistry.stop_all(block=True, timeout=10.0)
        except pykka.Timeout:
            problems.append("and they did not stop within 10s")

    _drain_hub()

    leaked_threads = [t for t in _live_threads() if t not in threads_before]
    if leaked_threads:
        deadline = THREAD_GRACE_SECONDS
        for thread in leaked_threads:
            started = time.monotonic()
            thread.join(max(deadline, 0.0))
            deadline -= time.monotonic() - started
        leaked_threads = [t for t in leaked_threads if t.is_alive()]
    if leaked_threads:
        problems.append(
            "threads still alive: "
            + ", ".join(f"{t.name} (ident={t.ident}, daemon={t.daemon})" for t in leaked_threads)
        )

    leaked_greenlets = [g for g in _tracker.live() if g not in greenlets_before]
    if leaked_greenlets:
        gc.collect()
        _drain_hub()
        leaked_greenlets = [g for g in leaked_greenlets if not g.dead]
    if leaked_greenlets:
        problems.append(
            "greenlets still alive:\n  "
            + "\n  ".join(_describe_greenlet(g) for g in leaked_greenlets)
        )
        _kill_greenlets(leaked_greenlets)

    started = request.node.stash.get(_STARTED, [])
    if started:
        _gone, alive = psutil.wait_procs(started, timeout=PROCESS_GRACE_SECONDS)
        if alive:
            problems.append(
                "processes still running (killed now): "
                + ", ".join(f"{p.pid} {_cmdline(p)}" for p in alive)
            )
            for proc in alive:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(alive, timeout=PROCESS_GRACE_SECONDS)

    report = request.node.stash.get(_CALL_REPORT, None)
    if problems and (report is None or report.passed):
        pytest.fail("test leaked resources:\n" + "\n".join(problems), pytrace=False)


def _cmdline(proc: Any) -> str:
    try:
        return " ".join(proc.cmdline())[:200]
    except psutil.Error:
        return "(ended)"


def _kill_greenlets(glets: list[greenlet.greenlet]) -> None:
    # Best effort, so the next test starts clean: only greenlets of this thread's
    # hub can be killed from here.
    hub = get_hub_if_exists()
    if hub is None:
        return
    for glet in glets:
        if glet.parent is hub and not glet.dead:
            gevent.kill(glet)
    _drain_hub()


def pytest_report_header() -> str:
    return f"subagents: gevent monkey-patched={MONKEYPATCHED}, python {sys.version.split()[0]}"


# -- runtimes ---------------------------------------------------------------------


@pytest.fixture
def rt(backend: Backend) -> Iterator[Any]:
    """A runtime without persistence (sessions live only), on ``backend``."""
    from subagents.actors import Runtime

    with Runtime(backend=backend) as runtime:
        yield runtime


@pytest.fixture
def rt_sqlite(backend: Backend, tmp_path: Any) -> Iterator[Any]:
    """A runtime on the embedded SQLite store, on ``backend``."""
    from subagents.actors import Runtime

    with Runtime(str(tmp_path / "sessions.db"), backend=backend) as runtime:
        yield runtime


# -- PostgreSQL --------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The url of a PostgreSQL server for this test session:
    ``SUBAGENTS_TEST_POSTGRES_URL`` when set (CI starts one), else a throwaway
    cluster started here (``tests/pgcluster.py``) and removed at the end. Without
    either, PostgreSQL tests are skipped -- unless ``SUBAGENTS_REQUIRE_POSTGRES``
    is set, when that is an error."""
    url = os.environ.get("SUBAGENTS_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    with _throwaway_cluster() as cluster:
        yield cluster.url


@pytest.fixture(scope="module")
def own_pg_server() -> Iterator[Any]:
    """A private throwaway cluster (``tests/pgcluster.py``'s ``Cluster``), for tests that
    stop or restart the server: never the shared one. Skipped like ``pg_server``."""
    with _throwaway_cluster() as cluster:
        yield cluster


@contextlib.contextmanager
def _throwaway_cluster() -> Iterator[Any]:
    """A cluster started here and removed after; without PostgreSQL binaries the test
    is skipped, unless ``SUBAGENTS_REQUIRE_POSTGRES`` is set."""
    import pgcluster

    try:
        # Watched: a worker killed on a timeout still leaves no server running.
        cluster = pgcluster.start(owner_pid=os.getpid())
    except RuntimeError as exc:
        if os.environ.get("SUBAGENTS_REQUIRE_POSTGRES"):
            raise
        pytest.skip(f"no PostgreSQL server: {exc}")
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A url of ``pg_server`` naming a schema of this test's own (``?schema=t_...``),
    dropped afterwards."""
    import uuid

    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    sep = "&" if "?" in pg_server else "?"
    yield f"{pg_server}{sep}schema={schema}"
    for attempt in range(5):
        try:
            with psycopg.connect(pg_server, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            return
        except psycopg.errors.DeadlockDetected:
            # A killed worker's server process may still be finishing a statement
            # on the schema (the server notices the client is gone only then): the
            # drop, chosen as the deadlock's victim, goes through once it is done.
            if attempt == 4:
                raise


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A store location every runtime and worker process of a test shares: an SQLite
    file in the test's directory, or a PostgreSQL schema of the test's own
    (``pg_url``). The durable-inbox, dedup, lease, fencing and crash-replay tests
    take it and so run unchanged on both (a module may override it)."""
    if request.param == "sqlite":
        return str(tmp_path / "sessions.db")
    url: str = request.getfixturevalue("pg_url")
    return url
