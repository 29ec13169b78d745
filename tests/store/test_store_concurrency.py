"""Many threads at once: seqs stay gapless, group commit coalesces and isolates."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from subagents.protocol import ErrorCode, MessageEvent, SessionHeader, SubagentError, new_session_id
from subagents.store import SessionStore, SqliteStore

MakeHeader = Callable[..., SessionHeader]
MakeEvents = Callable[..., list[MessageEvent]]
RunThreads = Callable[..., list[Any]]

WRITERS = 16
PER_WRITER = 40


def _wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for a condition another thread makes true (a deadline, not an ordering sleep)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        pause.wait(0.001)


def test_sixteen_writers_gapless_nothing_lost(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents, threads: RunThreads
) -> None:
    shared = make_header()
    store.create_session(shared)
    own = [make_header() for _ in range(WRITERS)]
    for h in own:
        store.create_session(h)
    start = threading.Barrier(WRITERS)

    def writer(w: int) -> Callable[[], list[int]]:
        def run() -> list[int]:
            events = make_events(PER_WRITER, f"w{w}")
            start.wait()
            got: list[int] = []
            for i in range(0, PER_WRITER, 4):
                # single events and small batches to the own session, singles to the shared one
                got += store.append(own[w].id, events[i : i + 1])
                got += store.append(own[w].id, events[i + 1 : i + 4])
                store.append(shared.id, events[i : i + 1])
            return got

        return run

    results = threads([writer(w) for w in range(WRITERS)])
    for w, h in enumerate(own):
        assert results[w] == list(range(PER_WRITER))
        records = store.read(h.id)
        assert [r.seq for r in records] == list(range(PER_WRITER))
        assert all(r.event.content.startswith(f"w{w}:") for r in records)  # type: ignore[attr-defined]
    shared_records = store.read(shared.id)
    n = WRITERS * PER_WRITER // 4
    assert [r.seq for r in shared_records] == list(range(n))
    for w in range(WRITERS):
        mine = [r.event.content for r in shared_records if r.event.content.startswith(f"w{w}:")]  # type: ignore[attr-defined]
        assert mine == [f"w{w}:{i}:" + "x" * 150 for i in range(0, PER_WRITER, 4)]


def test_concurrent_creates_of_one_id_exactly_one_wins(
    store: SessionStore, make_header: MakeHeader, threads: RunThreads
) -> None:
    h = make_header()
    start = threading.Barrier(8)

    def create() -> str:
        start.wait()
        try:
            store.create_session(h)
        except SubagentError as exc:
            return exc.code
        return "created"

    outcomes = threads([create] * 8)
    assert outcomes.count("created") == 1
    assert outcomes.count(ErrorCode.SESSION_EXISTS) == 7


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    """A raw connection holding the database's write lock (like another process)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def test_group_commit_coalesces_waiting_appends(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """While one transaction waits, every append that arrives joins the next one."""
    path = tmp_path / "g.db"
    with SqliteStore(path) as store:
        sessions = [make_header() for _ in range(WRITERS)]
        for h in sessions:
            store.create_session(h)
        before = store.statistics()
        lock = _hold_write_lock(path)
        workers: list[threading.Thread] = []
        try:

            def start(h: SessionHeader) -> None:
                t = threading.Thread(target=store.append, args=(h.id, make_events(3)))
                t.start()
                workers.append(t)

            # The first append becomes the leader and blocks on the held lock...
            start(sessions[0])
            _wait_until(lambda: store.statistics().write_requests == before.write_requests + 1)
            # ... so the other fifteen queue up behind it.
            for h in sessions[1:]:
                start(h)
            _wait_until(lambda: store.statistics().pending == WRITERS - 1)
        finally:
            lock.execute("COMMIT")
            lock.close()
            for t in workers:
                t.join(30)
        after = store.statistics()
        assert after.transactions - before.transactions == 2
        assert after.write_requests - before.write_requests == WRITERS
        assert after.largest_batch == WRITERS - 1
        assert after.events_appended - before.events_appended == 3 * WRITERS
        for h in sessions:
            assert store.last_seq(h.id) == 2


def test_a_failing_request_does_not_fail_its_batch(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    path = tmp_path / "g.db"
    with SqliteStore(path) as store:
        good, existing, poisoned = make_header(), make_header(), make_header()
        for h in (good, existing, poisoned):
            store.create_session(h, make_events(1))
        # A trigger that fails one specific insert, to force an SQLite error mid-batch.
        with sqlite3.connect(path) as raw:
            raw.execute(
                "CREATE TRIGGER poison BEFORE INSERT ON events WHEN NEW.session = ?"
                " BEGIN SELECT RAISE(ABORT, 'poisoned'); END".replace("?", f"x'{poisoned.id}'")
            )
        raw.close()
        fresh = make_header()
        jobs: dict[str, Callable[[], Any]] = {
            "leader": lambda: store.append(good.id, make_events(1)),
            "good": lambda: store.append(good.id, make_events(2)),
            "unknown": lambda: store.append(new_session_id(), make_events(1)),
            "exists": lambda: store.create_session(existing),
            "poisoned": lambda: store.append(poisoned.id, make_events(1)),
            "create": lambda: store.create_session(fresh, make_events(2)),
            "depth": lambda: store.raise_delegation_depth(existing.id, 4),
        }
        outcomes: dict[str, Any] = {}

        def run(name: str) -> None:
            try:
                outcomes[name] = jobs[name]()
            except SubagentError as exc:
                outcomes[name] = exc.code

        lock = _hold_write_lock(path)
        workers: list[threading.Thread] = []
        try:
            for name in jobs:
                t = threading.Thread(target=run, args=(name,))
                t.start()
                workers.append(t)
                if name == "leader":
                    _wait_until(lambda: store.statistics().write_requests == 4)
            _wait_until(lambda: store.statistics().pending == len(jobs) - 1)
        finally:
            lock.execute("COMMIT")
            lock.close()
            for t in workers:
                t.join(30)
        assert outcomes == {
            "leader": [1],
            "good": [2, 3],
            "unknown": ErrorCode.SESSION_NOT_FOUND,
            "exists": ErrorCode.SESSION_EXISTS,
            "poisoned": ErrorCode.PERSISTENCE_UNAVAILABLE,
            "create": 1,
            "depth": store.header(existing.id),
        }
        assert store.header(existing.id).delegation_depth == 4  # type: ignore[union-attr]
        assert store.last_seq(poisoned.id) == 0
        assert store.last_seq(fresh.id) == 1
        assert store.last_seq(good.id) == 3


def test_close_during_concurrent_appends_ends_every_caller(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents, threads: RunThreads
) -> None:
    store = SqliteStore(tmp_path / "c.db")
    h = make_header()
    store.create_session(h)
    started = threading.Barrier(WRITERS + 1)

    def writer() -> int:
        started.wait()
        appended = 0
        while True:  # until the store refuses: every caller must get an answer
            try:
                store.append(h.id, make_events(1))
            except SubagentError as exc:
                assert exc.code == ErrorCode.STORE_CLOSED
                return appended
            appended += 1

    def closer() -> int:
        started.wait()
        store.close()
        return 0

    appended = sum(threads([writer] * WRITERS + [closer]))
    with pytest.raises(SubagentError):
        store.read(h.id)
    with SqliteStore(tmp_path / "c.db") as reopened:
        assert reopened.last_seq(h.id) == appended - 1


def test_sqlite_store_from_gevent_threadpool(
    sqlite_store: SqliteStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """How the gevent runtime calls a blocking store: greenlets hand calls to the threadpool."""
    import gevent

    assert SqliteStore.blocking
    shared = make_header()
    sqlite_store.create_session(shared)
    pool = gevent.get_hub().threadpool

    def greenlet_body(i: int) -> list[int]:
        seqs: list[int] = []
        for j in range(10):
            seqs += pool.apply(sqlite_store.append, (shared.id, make_events(1, f"{i}.{j}")))
        return seqs

    greenlets = [gevent.spawn(greenlet_body, i) for i in range(8)]
    gevent.joinall(greenlets, timeout=60, raise_error=True)
    assert all(g.dead for g in greenlets)
    seqs = sorted(s for g in greenlets for s in g.value)
    assert seqs == list(range(80))
    assert [r.seq for r in sqlite_store.read(shared.id)] == list(range(80))


def test_a_busy_lock_times_out_once_for_the_whole_batch(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents, threads: RunThreads
) -> None:
    path = tmp_path / "busy.db"
    with SqliteStore(path, busy_timeout_s=0.2) as store:
        sessions = [make_header() for _ in range(4)]
        for h in sessions:
            store.create_session(h)
        lock = _hold_write_lock(path)
        try:
            outcomes = threads(
                [lambda h=h: _code_of(lambda: store.append(h.id, make_events(1))) for h in sessions]
            )
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        assert outcomes == [ErrorCode.TIMEOUT] * 4
        assert store.append(sessions[0].id, make_events(1)) == [0]  # usable again


def _code_of(call: Callable[[], object]) -> str:
    try:
        call()
    except SubagentError as exc:
        return exc.code
    return "ok"
