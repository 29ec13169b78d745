"""The PostgreSQL store's connections through a server restart, an exhausted read
pool and a hung server: the first read after a restart succeeds, a pool held up by
a lock neither bypasses its bound nor reports the server unreachable, and the
writer stops waiting a connect timeout per batch once the server did not answer
(``Runtime.close()`` on a hung server is bounded).

Every test runs on a private cluster (``own_pg_server``): it restarts or stops it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from conftest import MakeHeader
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageEvent, SubagentError, new_message_id
from subagents.store import PostgresStore
from test_pg_hung import _hung


def _url(cluster: Any) -> str:
    return f"{cluster.url}?schema=s_{uuid.uuid4().hex[:12]}"


def _message(text: str) -> MessageEvent:
    return MessageEvent(message_id=new_message_id(), content=text)


def _read_at_once(store: PostgresStore, n: int, seconds: float) -> list[BaseException]:
    """``n`` reads at once, each ``seconds`` long on the server; what they raised."""
    barrier = threading.Barrier(n)
    failures: list[BaseException] = []

    def read() -> None:
        barrier.wait()
        try:
            store._query(f"SELECT pg_sleep({seconds})", ())
        except BaseException as exc:  # reported to the caller
            failures.append(exc)

    threads = [threading.Thread(target=read) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return failures


def _fill_pool(store: PostgresStore, n: int) -> None:
    """``n`` reads at once: the pool then holds ``n`` idle connections."""
    assert _read_at_once(store, n, 0.2) == []
    assert store._pool.get_stats()["pool_available"] >= 2


def test_the_first_read_after_a_server_restart_succeeds(own_pg_server: Any) -> None:
    """A restart drops every idle pooled connection: the read that meets the first
    one used to retry on the next, as dead, and fail ``PERSISTENCE_UNAVAILABLE``
    although the server was back."""
    with PostgresStore(_url(own_pg_server), pool_size=4) as store:
        for _ in range(3):
            _fill_pool(store, 4)
            own_pg_server.restart()
            assert store.list_headers(None) == []  # raised PERSISTENCE_UNAVAILABLE
            assert store.list_headers(None) == []


def test_an_exhausted_pool_is_a_timeout_and_keeps_its_bound(
    own_pg_server: Any, make_header: MakeHeader
) -> None:
    """Another session locks the sessions table while many threads read: the pool's
    connections all wait, the rest of the readers wait for one. That is not an
    outage: a reader that got none fails ``TIMEOUT`` (it failed
    ``PERSISTENCE_UNAVAILABLE``, and from then on every read opened a connection
    of its own -- one per reader, up to the server's ``max_connections``)."""
    url = _url(own_pg_server)
    schema = url.rsplit("=", 1)[1]
    pool, readers = 2, 24
    peak: list[Any] = [0, []]  # the most connections seen, and those
    stop = threading.Event()
    codes: Counter[str] = Counter()
    locker_pid = [0]

    def count() -> None:
        # The locker is left out by its pid: by its query text it counted while it
        # committed on its way out ("COMMIT"), a fourth connection now and then.
        with psycopg.connect(own_pg_server.url, autocommit=True) as conn:
            while not stop.is_set():
                rows = conn.execute(
                    "SELECT pid, state, query FROM pg_stat_activity"
                    " WHERE backend_type = 'client backend'"
                    " AND pid <> pg_backend_pid() AND pid <> %s",
                    (locker_pid[0],),
                ).fetchall()
                if len(rows) > peak[0]:
                    peak[:] = [len(rows), rows]
                time.sleep(0.05)

    def read() -> None:
        for _ in range(2):
            try:
                store.list_headers(None)
                codes["ok"] += 1
            except SubagentError as exc:
                codes[str(exc.code)] += 1

    with PostgresStore(url, pool_size=pool, connect_timeout_s=1, lock_timeout_s=5) as store:
        store.create_session(make_header())
        counter = threading.Thread(target=count)
        threads = [threading.Thread(target=read) for _ in range(readers)]
        try:
            with psycopg.connect(own_pg_server.url) as locker:
                locker_pid[0] = locker.info.backend_pid
                counter.start()
                locker.execute(f'LOCK TABLE "{schema}".sessions IN ACCESS EXCLUSIVE MODE')
                for t in threads:
                    t.start()
                time.sleep(2.5)
            for t in threads:
                t.join(30)
        finally:
            stop.set()
            if counter.ident is not None:
                counter.join(10)
        assert codes[str(ErrorCode.TIMEOUT)] > 0, codes
        assert set(codes) <= {"ok", str(ErrorCode.TIMEOUT)}, codes
        # The pool, the direct reads' cap (none used here) and the writer's connection.
        assert peak[0] <= pool + 1, peak
        assert len(store.list_headers(None)) == 1
        assert not store._reader.unreachable


def test_a_writer_that_met_a_hung_server_fails_at_once_until_it_answers(
    own_pg_server: Any, make_header: MakeHeader
) -> None:
    """Once a write was cut by the deadline (or its connect timed out), the next
    writes fail ``PERSISTENCE_UNAVAILABLE`` at once, naming why, instead of
    each waiting ``connect_timeout_s``; one probe at a time tries the server
    again, and once it answers writes succeed. Nothing accepted is lost."""
    header = make_header()
    store = PostgresStore(_url(own_pg_server), connect_timeout_s=2.0, statement_timeout_s=1.0)
    try:
        store.create_session(header)
        store.accept(header.id, [_message("before")], now=1.0)
        with _hung(own_pg_server):
            with pytest.raises(SubagentError) as first:  # cut after the deadline
                store.accept(header.id, [_message("cut")], now=2.0)
            assert first.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
            start = time.monotonic()
            for i in range(10):  # each used to wait connect_timeout_s
                with pytest.raises(SubagentError) as info:
                    store.accept(header.id, [_message(f"refused {i}")], now=3.0)
                assert info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
            assert time.monotonic() - start < 2 * 2.0 + 2.0
            assert "unreachable" in str(info.value) or "did not answer" in str(info.value)
        deadline = time.monotonic() + 15
        while True:  # the server answers again: a probe reconnects
            try:
                store.accept(header.id, [_message("after")], now=4.0)
                break
            except SubagentError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        contents = [e.event.content for e in store.pending(header.id)]
        assert contents[0] == "before" and contents[-1] == "after"
        assert not any(c.startswith("refused") for c in contents)
    finally:
        store.close()


def test_closing_a_runtime_on_a_hung_server_is_bounded(
    backend: Backend, own_pg_server: Any
) -> None:
    """``Runtime.close()`` with 8 resident sessions on a hung server: every agent's
    shutdown flush and lease release is a batch of its own, and each waited a full
    connect timeout (8 x 3 s and more); now about one. Reopened once the server
    answers, every session holds its completed turn."""
    connect_s, statement_s = 3.0, 1.0
    url = _url(own_pg_server)
    store = PostgresStore(url, connect_timeout_s=connect_s, statement_timeout_s=statement_s)
    rt = Runtime(store, backend=backend)
    try:
        rt.models.register("idle", lambda _o: lambda _turn: "ok")
        agents = [rt.spawn("idle") for _ in range(8)]
        for agent in agents:
            agent.followup("hi")
        for agent in agents:
            assert agent.wait_idle(30)
        rt.sessions.flush()
        with _hung(own_pg_server):
            start = time.monotonic()
            rt.close()
            took = time.monotonic() - start
        assert took < 3 * connect_s, took
    finally:
        rt.close()
        store.close()
    with Runtime(url, backend=backend) as again:
        for agent in agents:
            ends = again.sessions.turn_ends(agent.session_id)
            assert [e.output for e in ends] == ["ok"]


def test_reads_after_a_long_outage_do_not_wait_for_the_pools_backoff(
    own_pg_server: Any,
) -> None:
    """R-ERR-1, R-DUR-3: the server stays down for seconds while reads fail, then
    comes back. The pool's reconnection used to back off exponentially (1, 2, 4,
    8 s ... between attempts), and the attempts it had scheduled during the outage
    outlived it: once one read had found the server back, the next ones waited
    for the pool's next attempt -- up to the connect timeout, and then failed
    although the server answered (a runtime's lease renewal, which reads the
    server's clock first, waited as long, and its leases expired meanwhile)."""
    with PostgresStore(_url(own_pg_server), pool_size=2, connect_timeout_s=3) as store:
        store.list_headers(None)
        own_pg_server.stop("fast")
        # The length of the outage (not an ordering): the pool's backoff grows
        # while reads keep failing.
        down_until = time.monotonic() + 9
        while time.monotonic() < down_until:
            with pytest.raises(SubagentError) as err:
                store.list_headers(None)
            assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
            time.sleep(0.2)
        own_pg_server.start()
        for _ in range(5):
            started = time.monotonic()
            assert store.list_headers(None) == []  # failed after the connect timeout
            # A generous bound on a loaded machine, below the connect timeout.
            assert time.monotonic() - started < 2.5


def test_a_read_meeting_a_dead_connection_while_the_server_is_down_fails_fast(
    own_pg_server: Any,
) -> None:
    """R-ERR-1: the server stops with the pool's connections idle. The read that
    meets a dead one runs again on a connection of its own, refused at once:
    ``PERSISTENCE_UNAVAILABLE`` without waiting the connect timeout for the pool
    (it waited, and a runtime's mail task and lease renewal with it)."""
    with PostgresStore(_url(own_pg_server), pool_size=2, connect_timeout_s=6) as store:
        store.list_headers(None)
        own_pg_server.stop("fast")
        started = time.monotonic()
        with pytest.raises(SubagentError) as err:
            store.list_headers(None)
        assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert time.monotonic() - started < 3  # generous; it took the 6 s connect timeout
        own_pg_server.start()
        assert store.list_headers(None) == []


def test_a_refused_statement_after_an_outage_puts_the_pool_back_in_use(
    own_pg_server: Any,
) -> None:
    """R-ERR-1: after an outage, reads connect directly (two at a time) until one
    succeeds. The first such read here is a statement the server refuses (division
    by zero): the server answered, so reads go back to the pool. It used to leave
    the server marked unreachable, and with two reads already on connections of
    their own a third failed ``PERSISTENCE_UNAVAILABLE`` ("cannot be reached")
    although the server was up."""
    with PostgresStore(_url(own_pg_server), pool_size=4, connect_timeout_s=3) as store:
        store.list_headers(None)
        own_pg_server.stop("fast")
        with pytest.raises(SubagentError):
            store.list_headers(None)
        assert store._reader.unreachable
        own_pg_server.start()
        with pytest.raises(SubagentError) as refused:
            store._query("SELECT 1 / 0", ())
        assert "division by zero" in str(refused.value)
        assert not store._reader.unreachable
        assert _read_at_once(store, 4, 0.3) == []
