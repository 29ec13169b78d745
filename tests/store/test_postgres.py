"""What is particular to the PostgreSQL store (issue 14): opening and identifying
a schema, the URL, LISTEN/NOTIFY wake-ups, and its faults against a real server.

The store contract suite and the durability tests run on PostgreSQL too (their
``store`` and ``db`` fixtures); here are the rest. Faults that stop the server
use a private cluster (``own_pg_server``), never the shared one.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from conftest import MakeEvents, MakeHeader
from subagents.actors import Runtime
from subagents.actors._kernel import Doorbell
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    SessionHeader,
    SubagentError,
    TurnEnd,
    TurnStart,
    new_message_id,
)
from subagents.store import PG_SCHEMA_VERSION, PostgresStore, _pg_txn, open_store


def _code(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(SubagentError) as info:
        fn(*args, **kwargs)
    return str(info.value.code)


def _schema(url: str) -> str:
    return url.rsplit("schema=", 1)[1]


def _tables(server: str, schema: str) -> set[str]:
    with psycopg.connect(server, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchall()
    return {r[0] for r in rows}


# -- opening ------------------------------------------------------------------------


def test_a_new_schema_is_created_and_versioned(pg_server: str, pg_url: str) -> None:
    """Issue 14 point 1: the schema and its tables are created at the first open and
    stamped with the version; a second open migrates nothing."""
    with PostgresStore(pg_url) as store:
        assert store.schema == _schema(pg_url)
    tables = _tables(pg_server, _schema(pg_url))
    assert {"sessions", "events", "inbox", "leases", "subagents_schema"} <= tables
    with psycopg.connect(pg_server, autocommit=True) as conn:
        row = conn.execute(f'SELECT * FROM "{_schema(pg_url)}".subagents_schema').fetchall()
    assert row == [("subagents", PG_SCHEMA_VERSION)]
    with PostgresStore(pg_url):
        pass


def test_a_foreign_or_newer_schema_is_refused_untouched(pg_server: str, pg_url: str) -> None:
    """Issue 14 point 1: a schema with other tables is NOT_A_DATABASE, one of a newer
    version SCHEMA_TOO_NEW; neither is changed."""
    schema = _schema(pg_url)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".invoices (id int)')
    assert _code(PostgresStore, pg_url) == ErrorCode.NOT_A_DATABASE
    assert _tables(pg_server, schema) == {"invoices"}
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP TABLE "{schema}".invoices')
        # A table of our name with other columns: foreign too (it was the raw SQL
        # error, PERSISTENCE_UNAVAILABLE).
        conn.execute(f'CREATE TABLE "{schema}".subagents_schema (name text, rows int)')
    assert _code(PostgresStore, pg_url) == ErrorCode.NOT_A_DATABASE
    assert _tables(pg_server, schema) == {"subagents_schema"}
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP TABLE "{schema}".subagents_schema')
        conn.execute(f'CREATE TABLE "{schema}".subagents_schema (application text, version int)')
        conn.execute(f'INSERT INTO "{schema}".subagents_schema VALUES (%s, 99)', ("subagents",))
    with pytest.raises(SubagentError) as info:
        PostgresStore(pg_url)
    assert info.value.code == ErrorCode.SCHEMA_TOO_NEW
    assert info.value.hint["version"] == 99
    assert _tables(pg_server, schema) == {"subagents_schema"}


def test_create_false_refuses_a_schema_without_a_store(pg_server: str, pg_url: str) -> None:
    """What ``subagents tree`` opens with: no store there is NOT_A_DATABASE, and
    nothing is created."""
    assert _code(PostgresStore, pg_url, create=False) == ErrorCode.NOT_A_DATABASE
    assert _tables(pg_server, _schema(pg_url)) == set()


def test_concurrent_opens_migrate_once(pg_url: str) -> None:
    """Four threads open one new schema at once (an advisory lock serialises the
    migration): every open succeeds."""
    stores: list[PostgresStore] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def open_one() -> None:
        try:
            s = PostgresStore(pg_url, pool_size=1)
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            stores.append(s)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores:
        s.close()
    assert errors == [] and len(stores) == 4


def test_bad_arguments_and_an_unreachable_server(pg_server: str) -> None:
    assert _code(PostgresStore, "/tmp/x.db") == ErrorCode.INVALID_ARGUMENT
    assert _code(PostgresStore, pg_server, schema="Bad-Name") == ErrorCode.INVALID_ARGUMENT
    assert _code(PostgresStore, pg_server, pool_size=0) == ErrorCode.INVALID_ARGUMENT
    assert _code(PostgresStore, pg_server, lock_timeout_s=0) == ErrorCode.INVALID_ARGUMENT
    # An empty ?schema= was read as the default schema; a URL and an argument
    # naming two schemas, as the argument's: both said nothing.
    sep = "&" if "?" in pg_server else "?"
    assert _code(PostgresStore, f"{pg_server}{sep}schema=") == ErrorCode.INVALID_ARGUMENT
    two = f"{pg_server}{sep}schema=t_one"
    assert _code(PostgresStore, two, schema="t_two") == ErrorCode.INVALID_ARGUMENT
    # Nothing listens on port 1: a typed error, quickly.
    dead = "postgresql://postgres@127.0.0.1:1/postgres"
    assert _code(PostgresStore, dead, connect_timeout_s=2) == ErrorCode.PERSISTENCE_UNAVAILABLE


def test_an_unreachable_server_is_one_readable_sentence() -> None:
    """R-ERR-1: opening a store on a server nothing answers says what was being
    done and why, once: "opening a session store at URL failed: <psycopg's
    reason>" (it read "cannot open a session store at URL failed: ..."), the
    password left out of the URL."""
    dead = "postgresql://app:secret@127.0.0.1:1/postgres"
    with pytest.raises(SubagentError) as info:
        PostgresStore(dead, connect_timeout_s=2)
    assert info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
    message = str(info.value)
    assert message.startswith(
        "[PERSISTENCE_UNAVAILABLE] opening a session store at postgresql://app:***@127.0.0.1:1/"
    ), message
    assert " failed: " in message and "cannot open" not in message
    assert "secret" not in message


def test_urls_open_the_store_everywhere(backend: Backend, pg_url: str) -> None:
    """``open_store`` and ``Runtime(store=url)`` take a postgresql:// URL; the schema
    comes from its query."""
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore) and store.schema == _schema(pg_url)
    store.close()
    with Runtime(pg_url, backend=backend) as rt:
        assert isinstance(rt.store, PostgresStore)
        agent = rt.spawn("echo", label="on postgres")
        agent.followup("hello")
        assert agent.wait_idle(10)
        sid = agent.session_id
    with Runtime(pg_url, backend=backend) as rt:
        assert [h.id for h in rt.agents.roots()] == [sid]
        lease = rt.store.get_lease(sid) if rt.store is not None else None
        assert lease is not None and lease.holder is None  # released at close


# -- LISTEN/NOTIFY ---------------------------------------------------------------------


def test_notify_reaches_the_listener_of_another_store(pg_url: str) -> None:
    """Issue 14 point 3: a ring through one store (another process's pool) arrives on
    the listener of another: its socket turns readable, ``receive`` gives the
    payloads in order."""
    with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        listener = a.listen()
        try:
            assert listener.address.startswith("pg:")
            fd = listener.fileno()
            assert fd is not None
            assert b.notify(listener.address, b"\x01" * 16)
            assert b.notify(listener.address, b"\x02" * 16)
            assert not b.notify("@not-a-pg-address", b"x")
            got: list[bytes] = []
            while len(got) < 2:
                assert select.select([fd], [], [], 10)[0], "no notification arrived"
                got += listener.receive() or []
            assert got == [b"\x01" * 16, b"\x02" * 16]
        finally:
            listener.close()


def test_a_listener_whose_listen_is_refused_closes_its_connection(pg_url: str) -> None:
    """A listener whose ``LISTEN`` the server refuses (a hot standby refuses it
    during recovery; here a channel name it cannot parse) closes the connection it
    made for it, at opening and at each reconnect. It was left open: the mail task
    reconnects a lost listener every few seconds, one more server connection each
    time, until the server had no slot left."""
    from subagents.store import PgListener

    with PostgresStore(pg_url) as store:
        made: list[Any] = []

        def connect() -> Any:
            conn = store.connect()
            made.append(conn)
            return conn

        listener = PgListener(connect, 'refused"channel')
        try:
            assert listener.fileno() is None
            assert not listener.reconnect()
            assert len(made) == 2
            assert [conn.closed for conn in made] == [True, True]
        finally:
            listener.close()
            for conn in made:
                conn.close()


def test_the_doorbell_wakes_on_a_notify_and_a_lost_connection_means_sweep(
    backend: Backend, pg_server: str, pg_url: str, run_in: Any
) -> None:
    """The doorbell waits on its socket and the listener at once (both backends). A
    listener whose connection the server dropped reconnects and makes ``wait``
    return None (rings may be lost: sweep), then rings arrive again."""
    with PostgresStore(pg_url) as store:
        listener = store.listen()
        bell = Doorbell(backend, listener)
        try:
            assert bell.address == listener.address
            store.notify(bell.address, b"\x07" * 16)
            assert run_in(backend, bell.wait, 10) == [b"\x07" * 16]
            # This listener's connection only: the server is shared with the tests
            # of the other workers, whose listeners must not be dropped under them.
            pid = listener._conn.info.backend_pid  # type: ignore[union-attr]
            with psycopg.connect(pg_server, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            assert run_in(backend, bell.wait, 10) is None  # reconnected: sweep
            store.notify(bell.address, b"\x08" * 16)
            assert run_in(backend, bell.wait, 10) == [b"\x08" * 16]
        finally:
            bell.close()
            listener.close()


def test_a_listener_reconnecting_to_a_hung_server_does_not_block_the_hub(
    own_pg_server: Any,
) -> None:
    """gevent: the server's port accepts connections and never answers (a hung
    server, a black-holed path). The doorbell's listener, its connection lost,
    reconnects -- a blocking connect, up to ``connect_timeout_s`` -- off the hub:
    the other greenlets run meanwhile. (It connected on the hub, which stopped
    every greenlet of the process for the whole timeout, again each retry.)

    The one duration here is a bound with a wide margin on a real socket's
    timeout (no frozen clock reaches psycopg's connect): this greenlet, waiting
    for the silent server to accept the reconnect, runs again well within the
    30 s the connect waits (it ran again only after them)."""
    import socket

    from subagents.actors._kernel._backend import GEVENT

    url = f"{own_pg_server.url}?schema=s_{uuid.uuid4().hex[:12]}"
    with PostgresStore(url, connect_timeout_s=30) as store:
        listener = store.listen()
        bell = Doorbell(GEVENT, listener)
        silent = socket.socket()
        held: list[socket.socket] = []
        accepted = threading.Event()
        accepted_at: list[float] = []
        acceptor = threading.Thread(target=lambda: accept(), daemon=True)

        def accept() -> None:  # an OS thread: the port answers TCP, then nothing
            with contextlib.suppress(OSError):
                while True:
                    held.append(silent.accept()[0])
                    accepted_at.append(time.monotonic())
                    accepted.set()

        try:
            own_pg_server.stop("immediate")
            silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            silent.bind(("127.0.0.1", own_pg_server.port))
            silent.listen(16)
            acceptor.start()
            waiter = GEVENT.spawn(bell.wait, 60)
            assert GEVENT.run_blocking(accepted.wait, 60)
            assert time.monotonic() - accepted_at[0] < 15
        finally:
            with contextlib.suppress(OSError):
                silent.shutdown(socket.SHUT_RDWR)  # wakes the acceptor (close does not)
            silent.close()
            acceptor.join(30)
            for conn in held:
                conn.close()
            bell.close()
            assert waiter.join(60)
            listener.close()
            own_pg_server.start()


def test_a_runtime_on_postgres_records_a_notify_address_in_its_leases(
    backend: Backend, pg_url: str
) -> None:
    with Runtime(pg_url, backend=backend) as rt:
        agent = rt.spawn("echo")
        lease = rt.store.get_lease(agent.session_id) if rt.store is not None else None
        assert lease is not None and lease.wake is not None and lease.wake.startswith("pg:")


# -- faults ---------------------------------------------------------------------------


def test_a_connection_killed_mid_transaction_fails_its_call_and_the_next_succeeds(
    pg_server: str,
    pg_url: str,
    make_header: MakeHeader,
    make_events: MakeEvents,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 14 point 5: the writer's connection is terminated by the server inside an
    acceptance's transaction: the call fails ``PERSISTENCE_UNAVAILABLE`` with
    nothing of it committed; the next call reconnects and succeeds; what was
    accepted before is intact."""
    with PostgresStore(pg_url) as store:
        header: SessionHeader = make_header()
        store.create_session(header)
        first = make_events(1)
        store.accept(header.id, first, now=1.0)
        original = _pg_txn.PgTxn.accept_messages
        killed: list[bool] = []

        def killing(self: Any, *args: Any) -> Any:
            if not killed:
                killed.append(True)
                pid = self.conn.raw.info.backend_pid
                with psycopg.connect(pg_server, autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            return original(self, *args)

        monkeypatch.setattr(_pg_txn.PgTxn, "accept_messages", killing)
        doomed = make_events(1)
        with pytest.raises(SubagentError) as info:
            store.accept(header.id, doomed, now=2.0)
        assert info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert [e.message_id for e in store.pending(header.id)] == [first[0].message_id]
        again = store.accept(header.id, doomed, now=3.0)
        assert [a.duplicate for a in again] == [False]
        assert [e.message_id for e in store.pending(header.id)] == [
            first[0].message_id,
            doomed[0].message_id,
        ]


def test_the_first_write_after_a_server_restart_succeeds(
    backend: Backend,
    own_pg_server: Any,
    make_header: MakeHeader,
    make_events: MakeEvents,
) -> None:
    """The server restarts while the store's write connection sits idle: the next
    write -- an acceptance, and a turn's end in a runtime -- succeeds (its
    ``BEGIN`` on the dropped connection fails, having written nothing, and runs
    again on a fresh one). The first write after every restart used to fail
    ``PERSISTENCE_UNAVAILABLE``, and a turn whose end it was stopped its agent."""
    url = f"{own_pg_server.url}?schema=s_{uuid.uuid4().hex[:12]}"
    with PostgresStore(url) as store:
        header: SessionHeader = make_header()
        store.create_session(header)
        store.accept(header.id, make_events(1), now=1.0)
        for round_ in range(2):
            own_pg_server.restart()
            store.accept(header.id, make_events(1), now=2.0 + round_)
        assert len(store.pending(header.id)) == 3
    gate = Gate("turn")
    with Runtime(url, backend=backend) as rt:
        rt.models.register("slow", lambda _o: lambda turn: gate.pass_through(turn.signal))
        agent = rt.spawn("slow")
        agent.followup("spans the restart")
        assert gate.wait_reached(30)
        # The turn's start committed first: a write the restart cuts in the middle
        # fails, as documented; the one under test is the first after it.
        rt.sessions.flush()
        own_pg_server.restart()
        gate.release()
        assert agent.wait_idle(30)
        rt.sessions.flush()
        assert not rt.sessions.statistics().persistence_failures
        assert rt.agents.get(agent.session_id) is agent
        assert [e.stop_reason for e in rt.sessions.turn_ends(agent.session_id)] == ["completed"]


def test_a_server_restart_mid_stream_loses_nothing_accepted(
    backend: Backend, own_pg_server: Any
) -> None:
    """Issue 14 point 5: messages stream to a session (``agents.send`` with an id, as a
    server would) while the server stops and starts again. A call made while it is
    down fails with a typed error and accepts nothing; retried with the same id
    once the server is back, it succeeds. (Under strict durability the agent whose
    write failed stopped; ``send`` resumes it.) Every accepted message ran in
    exactly one completed turn, in the order accepted."""
    schema = f"s_{uuid.uuid4().hex[:12]}"
    url = f"{own_pg_server.url}?schema={schema}"
    try:
        with Runtime(url, backend=backend) as rt:
            rt.models.register("note", lambda _o: lambda turn: turn.content)
            sid = rt.spawn("note").session_id
            accepted: list[str] = []
            refused = 0
            for i in range(40):
                if i == 15:
                    own_pg_server.stop("fast")
                if i == 25:
                    own_pg_server.start()
                mid = new_message_id()
                for _attempt in range(50):
                    try:
                        rt.agents.send(sid, f"m{i}", message_id=mid)
                    except SubagentError as exc:
                        assert exc.code in (
                            ErrorCode.PERSISTENCE_UNAVAILABLE,
                            ErrorCode.TIMEOUT,
                            ErrorCode.AGENT_DISPOSED,
                        ), exc
                        refused += 1
                        if 15 <= i < 25:
                            break  # down: the caller gives this one up
                        continue  # back: retry with the same id
                    accepted.append(f"m{i}")
                    break
            assert refused, "no call saw the server down"
            assert accepted[:15] == [f"m{i}" for i in range(15)]
            assert accepted[-15:] == [f"m{i}" for i in range(25, 40)]
            agent = rt.agents.get(sid)
            assert agent is not None and agent.wait_idle(30)
            rt.sessions.flush()
            events = [r.event for r in rt.sessions.read(sid)]
        starts = {e.turn: e for e in events if isinstance(e, TurnStart)}
        contents = {e.message_id: e.content for e in events if isinstance(e, MessageEvent)}
        completed = [
            contents[m]
            for e in events
            if isinstance(e, TurnEnd) and e.stop_reason == "completed"
            for m in starts[e.turn].message_ids
        ]
        assert completed == accepted
    finally:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(own_pg_server.url, autocommit=True) as conn,
        ):
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- listings follow the subtree --------------------------------------------------------


def _plan(store: PostgresStore, sql: str, params: tuple[Any, ...]) -> str:
    from subagents.store._pg_schema import reorder, translate

    text, order = translate(sql)
    with store.connect() as conn:
        # Sequential scans priced out: the plan is an index's if some index can
        # serve the query at all (PostgreSQL falls back to a Seq Scan when none
        # can), whatever a small table makes cheapest today.
        conn.execute("SET enable_seqscan = off")
        rows = conn.execute("EXPLAIN " + text, reorder(order, params)).fetchall()
    return "\n".join(r[0] for r in rows)


def test_the_catalog_listings_are_indexed_queries(pg_url: str, make_header: MakeHeader) -> None:
    """Issue 14 point 3: among 3,000 sessions, one parent's children and its
    children's projections are read through indexes (their cost follows the
    subtree, not the table): an index serves each statement a listing runs."""
    with PostgresStore(pg_url) as store:
        parents = [make_header() for _ in range(30)]
        kids = [make_header(parent=p.id) for p in parents for _ in range(99)]
        store.write_many([("create", h, []) for h in parents + kids])
        store.write_many([("projection", k.id, "subagent", -1, b"x") for k in kids])
        with store.connect() as conn:
            conn.execute("ANALYZE")
        key = parents[3].id.to_bytes()
        mine = [k.id.to_bytes() for k in kids if k.parent_session == parents[3].id]
        plans = [
            _plan(
                store,
                "SELECT created_at, id, parent, header FROM sessions WHERE parent IN (?)"
                " ORDER BY created_at, id",
                (key,),
            ),
            _plan(
                store,
                "SELECT id, header FROM sessions WHERE parent = ? ORDER BY created_at, id",
                (key,),
            ),
            _plan(
                store,
                "SELECT session, seq, data FROM projection_cache WHERE unit = ?"
                f" AND session IN ({','.join('?' * len(mine))})",
                ("subagent", *mine),
            ),
        ]
        for plan, index in zip(plans, ("sessions_by_parent",) * 2 + ("projection_cache_pkey",)):
            assert "Seq Scan" not in plan, plan
            assert f" on {index}" in plan or f"using {index}" in plan, plan
            assert "Index Cond" in plan, plan
        # What the store actually runs for a listing: these statements.
        children = store.scan_children([parents[3].id])
        assert [h.id for h in children if isinstance(h, SessionHeader)] == [
            k.id for k in kids if k.parent_session == parents[3].id
        ]


# -- races between processes' connections -------------------------------------------------
#
# Two store instances are two write connections (as two processes or hosts would
# have): their transactions really run at once on the server, where one instance's
# group commit would serialise them.


def _together(n: int, fn: Any, *args: Any) -> None:
    """Run ``fn(k, barrier, *args)`` in ``n`` threads released at once; join them."""
    barrier = threading.Barrier(n)
    threads = [threading.Thread(target=fn, args=(k, barrier, *args)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)


def _grab(
    i: int, barrier: Any, stores: Any, sid: Any, now: float, winners: list[Any], lock: Any
) -> None:
    barrier.wait()
    try:
        lease = stores[i % 2].acquire_lease(sid, f"h{i}", now=now, expires=now + 50)
    except SubagentError as exc:
        assert exc.code == ErrorCode.LEASE_HELD
        return
    with lock:
        winners.append(lease)


def test_racing_acquisitions_across_connections_have_one_winner(
    pg_url: str, make_header: MakeHeader
) -> None:
    """Issue 14 point 3: eight holders on two connections race for one free lease,
    20 rounds: one winner each round (the session's row lock serialises them), and
    only its epoch can write."""
    with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        h = make_header()
        a.create_session(h)
        for round_ in range(20):
            winners: list[Any] = []
            _together(8, _grab, (a, b), h.id, 1000.0 + round_ * 100, winners, threading.Lock())
            assert len(winners) == 1, winners
            assert a.get_lease(h.id) == winners[0]
            for store in (a, b):
                with pytest.raises(SubagentError) as info:
                    store.append(h.id, [], lease=(f"h-{round_}", winners[0].epoch))
                assert info.value.code == ErrorCode.LEASE_LOST


def _write(
    k: int,
    barrier: Any,
    stores: Any,
    sid: Any,
    pool: list[Any],
    make_events: MakeEvents,
    fresh: list[int],
    lock: Any,
) -> None:
    store = stores[k % 2]
    barrier.wait()
    for i in range(4):
        store.append(sid, make_events(2))
        (accepted,) = store.accept(sid, [pool[(k * 2 + i) % 16]])
        if not accepted.duplicate:
            with lock:
                fresh.append(accepted.n)


def test_appends_and_acceptances_across_connections_never_repeat_or_skip(
    pg_url: str, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Issue 14 point 3: 8 threads on two connections append to one session and accept
    into its inbox at once, repeating each other's message ids, 10 rounds: seqs are
    gapless, every id is accepted once, inbox places are gapless."""
    with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        for _round in range(10):
            h = make_header()
            a.create_session(h)
            fresh: list[int] = []
            _together(
                8, _write, (a, b), h.id, make_events(16), make_events, fresh, threading.Lock()
            )
            assert [r.seq for r in b.read(h.id)] == list(range(64))
            pending = a.pending(h.id)
            assert [e.n for e in pending] == list(range(1, len(pending) + 1))
            assert sorted(fresh) == [e.n for e in pending]
            assert len({e.message_id for e in pending}) == len(pending)
