"""Holders of another host whose process ended, as the store can tell
(``DurableQueues.unheard_work``) and the holder judges them (``Holder.unheard``).

A worker on another host killed with SIGKILL left its leases live until they
expired (30 s by default): a pid means nothing across hosts. On PostgreSQL each
runtime's listening connection is named after its channel, so the server tells
every host which holders still listen: work under the lease of one that does
not is listed, and the sweep takes it up once the holder stayed unheard for a
grace period (``tests/durability/test_unheard_holder.py``). Other stores can
tell nothing: ``[]`` (R-DUR-*; issue 13: "durable across crashes and processes").
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from conftest import MakeEvents, MakeHeader
from subagents.protocol import ErrorCode, MessageId, SubagentError
from subagents.store import Holder, PgListener, PostgresStore, SessionStore

NOW = 1_000.0


def _leased(
    store: SessionStore, make_header: MakeHeader, holder: str, wake: str | None, **kw: Any
) -> Any:
    h = make_header()
    store.create_session(h)
    store.acquire_lease(h.id, holder, now=NOW, expires=kw.get("expires", NOW + 30), wake=wake)
    return h.id


def _until(check: Any, timeout: float = 10.0) -> Any:
    """Poll ``check()`` (the server ends a closed connection's session moments later)."""
    end = time.monotonic() + timeout
    while not (got := check()) and time.monotonic() < end:
        time.sleep(0.02)
    return got


def test_other_stores_can_tell_nothing(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Memory and SQLite: nothing tells a holder of another host is gone."""
    if isinstance(store, PostgresStore):
        pytest.skip("PostgreSQL can tell: the tests below")
    sid = _leased(store, make_header, "elsewhere:7:a", "pg:subagents_heard_" + "0" * 24)
    store.accept(sid, make_events(1))
    assert store.unheard_work(NOW + 10) == []


def test_bad_arguments_are_typed(store: SessionStore) -> None:
    for now in ("now", float("nan"), None):
        with pytest.raises(SubagentError) as err:
            store.unheard_work(now)  # type: ignore[arg-type]
        assert err.value.code == ErrorCode.INVALID_ARGUMENT


def test_work_of_a_holder_whose_listener_is_gone_is_listed(
    pg_url: str, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Listed once the holder's listening connection is gone: pending messages or an
    open promise under its live lease. Never listed: a holder still listening, an
    expired lease, nothing pending, a channel of an earlier version's form (it
    was never named: nobody can judge it), a lease with no wake address."""
    with PostgresStore(pg_url) as store:
        listening = store.listen()
        going = store.listen()
        assert listening.address.startswith("pg:subagents_heard_")
        try:
            alive = _leased(store, make_header, "there:1:a", listening.address)
            store.accept(alive, make_events(1))
            gone = _leased(store, make_header, "there:2:b", going.address)
            store.accept(gone, make_events(2))
            owed = _leased(store, make_header, "there:2:b", going.address)
            store.owe(owed, [MessageId("a" * 32)])
            expired = _leased(store, make_header, "there:2:b", going.address, expires=NOW + 5)
            store.accept(expired, make_events(1))
            done = _leased(store, make_header, "there:2:b", going.address)
            (message,) = make_events(1)
            store.accept(done, [message])
            store.complete(done, [message.message_id])
            old = _leased(store, make_header, "there:3:c", "pg:subagents_" + "1" * 24)
            store.accept(old, make_events(1))
            unwoken = _leased(store, make_header, "there:4:d", None)
            store.accept(unwoken, make_events(1))

            assert store.unheard_work(NOW + 10) == []  # both still listen
            going.close()
            found = _until(lambda: store.unheard_work(NOW + 10))
            assert sorted(found) == sorted([(gone, "there:2:b"), (owed, "there:2:b")])
            assert store.unheard_work(NOW + 40) == []  # every lease lapsed
        finally:
            listening.close()
            going.close()


def test_a_listener_reconnecting_is_heard_again(pg_url: str, make_header: MakeHeader,
                                                make_events: MakeEvents) -> None:  # fmt: skip
    """The server ends the listener's session (an administrator, a restart): unheard
    until it reconnects, under the same name; heard again after."""
    with PostgresStore(pg_url) as store:
        listener = store.listen()
        try:
            sid = _leased(store, make_header, "there:1:a", listener.address)
            store.accept(sid, make_events(1))
            with psycopg.connect(pg_url.split("?")[0], autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s",
                    (listener.address[3:],),
                )
            assert _until(lambda: store.unheard_work(NOW + 10)) == [(sid, "there:1:a")]
            assert _until(lambda: listener.receive() is None)  # it finds its connection lost
            assert listener.reconnect()
            assert store.unheard_work(NOW + 10) == []
        finally:
            listener.close()


def test_a_listener_whose_name_is_not_shown_takes_the_plain_form(pg_url: str) -> None:
    """A channel of the judged form whose connection does not show that name -- the
    server cuts it to 63 bytes here; a pooler may rewrite it -- is renamed to the
    plain form before its address is known: nobody will judge it by a name it
    does not have. One that cannot connect at first takes the plain form too."""
    with PostgresStore(pg_url) as store:
        long = PgListener(store.connect, "subagents_heard_" + "2" * 60)
        try:
            assert long.address == "pg:subagents_" + "2" * 60
        finally:
            long.close()

    def refused() -> Any:
        raise psycopg.OperationalError("no server")

    offline = PgListener(refused, "subagents_heard_" + "3" * 24)
    assert offline.address == "pg:subagents_" + "3" * 24
    assert offline.fileno() is None
    offline.close()


# -- the holder's judgement ------------------------------------------------------------


def test_a_holder_is_gone_only_when_unheard_at_every_look_for_the_grace() -> None:
    """Gone: found at every judgement for ``grace`` seconds. One heard at a look (not
    found) starts again; this holder itself is never judged; ``dead`` follows the
    last judgement; ``recheck_at`` is when the next could find one gone."""
    me, grace = Holder(), 5.0
    a, b = "there:1:a", "there:2:b"
    assert me.recheck_at(grace) is None
    assert me.unheard({a, me.id}, grace, now=100.0) == frozenset()
    assert me.recheck_at(grace) == 105.0
    assert not me.dead(a)
    assert me.unheard({a, b}, grace, now=104.9) == frozenset()
    assert me.recheck_at(grace) == 105.0
    assert me.unheard({a, b}, grace, now=105.0) == {a}
    assert me.dead(a) and not me.dead(b) and not me.dead(me.id)
    assert me.recheck_at(grace) == 109.9
    # a heard (or its work taken up): it starts again; b stays in question
    assert me.unheard({b}, grace, now=106.0) == frozenset()
    assert not me.dead(a)
    assert me.unheard({a, b}, grace, now=110.0) == {b}
    assert me.unheard({a, b}, grace, now=115.0) == {a, b}
    assert me.recheck_at(grace) is None


def test_nothing_is_judged_where_pg_stat_activity_is_not_readable(
    own_pg_server: Any, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """A role that may not read ``pg_stat_activity`` (its grant revoked): the listener
    still listens -- in the plain form, never judged --, and ``unheard_work``
    answers ``[]`` instead of failing every sweep. (A refused check used to keep
    the listener from ever listening.)"""
    import uuid

    with psycopg.connect(own_pg_server.url, autocommit=True) as admin:
        admin.execute("CREATE ROLE watcher LOGIN")
        admin.execute("GRANT CREATE ON DATABASE postgres TO watcher")
        admin.execute("REVOKE SELECT ON pg_catalog.pg_stat_activity FROM PUBLIC")
    url = own_pg_server.url.replace("postgres@", "watcher@", 1)
    with PostgresStore(f"{url}?schema=w_{uuid.uuid4().hex[:12]}") as store:
        listener = store.listen()
        try:
            assert listener.address.startswith("pg:subagents_")
            assert not listener.address.startswith("pg:subagents_heard_")
            assert listener.fileno() is not None  # listening
            sid = _leased(store, make_header, "there:1:a", "pg:subagents_heard_" + "4" * 24)
            store.accept(sid, make_events(1))
            assert store.unheard_work(NOW + 10) == []
            assert store.notify(listener.address, b"\x05" * 16)
            assert _until(lambda: listener.receive()) == [b"\x05" * 16]
        finally:
            listener.close()
