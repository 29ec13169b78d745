"""Lease renewal as one heartbeat a holder (``store/_durable.py``, "Leases").

Issue 13 point 4 asks for leases "renewed while resident". A renewal used to
rewrite every lease row its holder had: a runtime with 100,000 resident children
rewrote 100,000 rows every ``ttl / 3`` (on PostgreSQL as many dead tuples for
the vacuum), a million of them a million. Now a renewal writes the holder's one
heartbeat row; a lease is live until the later of its own expiry and its
holder's heartbeat. The contract is the same on every store; the SQL stores'
tests below also check that the lease rows are left alone.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import MakeEvents, MakeHeader, run_threads
from subagents.protocol import ErrorCode, SubagentError
from subagents.store import (
    SCHEMA_VERSION,
    PostgresStore,
    SessionStore,
    SqliteStore,
    _pg_schema,
    _schema,
)

NOW = 1_000.0


def _held(store: SessionStore, session_id: Any, *, by: str, at: float) -> SubagentError:
    with pytest.raises(SubagentError) as err:
        store.acquire_lease(session_id, by, now=at, expires=at + 30)
    assert err.value.code == ErrorCode.LEASE_HELD
    return err.value


def test_a_renewal_keeps_every_lease_of_its_holder_live(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Issue 13 point 4: after a renewal every lease of the holder is live until the
    renewal's expiry, past the acquisition's own: another holder cannot take it,
    a sweep does not adopt it, ``get_lease`` and ``LEASE_HELD`` report the renewed
    expiry. A lease another holder took is no longer the renewer's to extend."""
    heads = [make_header() for _ in range(3)]
    for h in heads:
        store.create_session(h)
        store.acquire_lease(h.id, "me", now=NOW, expires=NOW + 1, wake="w-me")
    store.accept(heads[0].id, make_events(1))  # work a sweep would adopt if unheld
    assert store.renew_lease_count("me", NOW + 50) == 3
    for h in heads:
        lease = store.get_lease(h.id)
        assert lease is not None
        assert (lease.holder, lease.epoch, lease.expires, lease.wake) == ("me", 1, NOW + 50, "w-me")
        assert _held(store, h.id, by="you", at=NOW + 10).hint["expires"] == NOW + 50
    assert heads[0].id not in store.orphans(NOW + 10)
    assert heads[0].id in store.orphans(NOW + 50)
    taken = store.acquire_lease(heads[1].id, "you", now=NOW + 50, expires=NOW + 80)
    assert (taken.holder, taken.epoch) == ("you", 2)
    assert store.renew_lease_count("me", NOW + 100) == 2
    assert sorted(store.renew_leases("me", NOW + 110)) == sorted([heads[0].id, heads[2].id])
    theirs = store.get_lease(heads[1].id)
    assert theirs is not None and (theirs.holder, theirs.expires) == ("you", NOW + 80)
    mine = store.get_lease(heads[2].id)
    assert mine is not None and mine.expires == NOW + 110


def test_a_lease_taken_after_a_renewal_lives_by_the_later_of_the_two(
    store: SessionStore, make_header: MakeHeader
) -> None:
    """A lease acquired after its holder's last renewal is live until its own expiry
    when that is later (a holder's first lease lives before any renewal); a released
    lease is free whatever its holder's heartbeat says."""
    early, late, released = make_header(), make_header(), make_header()
    for h in (early, late, released):
        store.create_session(h)
    store.acquire_lease(early.id, "me", now=NOW, expires=NOW + 5)
    store.renew_lease_count("me", NOW + 20)
    store.acquire_lease(late.id, "me", now=NOW + 10, expires=NOW + 40)
    gone = store.acquire_lease(released.id, "me", now=NOW + 10, expires=NOW + 40)
    assert store.release_lease(released.id, gone.token())
    _held(store, late.id, by="you", at=NOW + 30)
    assert store.acquire_lease(early.id, "you", now=NOW + 30, expires=NOW + 60).epoch == 2
    assert store.acquire_lease(released.id, "you", now=NOW + 11, expires=NOW + 60).epoch == 2
    assert store.renew_lease_count("me", NOW + 100) == 1  # late alone


# -- the SQL stores: one row written ------------------------------------------------------


def _server(store: PostgresStore) -> str:
    return store.url.rsplit("schema=", 1)[0].rstrip("?&")


def _raw_rows_at(path: Path, sql: str) -> list[tuple[Any, ...]]:
    """``sql`` read from the SQLite file at ``path``, on a connection of its own."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _raw_rows(store: SessionStore, sql: str) -> list[tuple[Any, ...]]:
    """``sql`` read past the store, on a connection of its own."""
    if isinstance(store, SqliteStore):
        return _raw_rows_at(Path(store.path), sql)
    assert isinstance(store, PostgresStore)
    with psycopg.connect(_server(store), autocommit=True) as pg:
        pg.execute(f'SET search_path TO "{store.schema}"')
        return [tuple(r) for r in pg.execute(sql).fetchall()]  # type: ignore[arg-type]


def test_a_late_renewal_never_shortens_the_heartbeat(
    store: SessionStore, make_header: MakeHeader
) -> None:
    """A renewal committed late (its batch waited on a lock, its process stalled)
    does not move its holder's heartbeat back behind one a later renewal wrote:
    the holder's leases stayed live only until the older expiry, and another
    process could take them over while they were held."""
    head = make_header()
    store.create_session(head)
    store.acquire_lease(head.id, "me", now=NOW, expires=NOW + 1)
    store.renew_lease_count("me", NOW + 50)
    store.renew_lease_count("me", NOW + 20)  # the late one
    lease = store.get_lease(head.id)
    assert lease is not None and lease.expires == NOW + 50
    _held(store, head.id, by="other", at=NOW + 30)


def test_a_renewal_writes_no_lease_row(store: SessionStore, make_header: MakeHeader) -> None:
    """On SQLite and PostgreSQL a renewal of 200 leases leaves the 200 lease rows as
    they were (no row rewritten, no dead tuple) and writes the holder's heartbeat."""
    if not isinstance(store, (SqliteStore, PostgresStore)):
        pytest.skip("the memory store has no rows")
    for _ in range(200):
        h = make_header()
        store.create_session(h)
        store.acquire_lease(h.id, "me", now=NOW, expires=NOW + 1)
    assert store.renew_lease_count("me", NOW + 50) == 200
    assert len(store.renew_leases("me", NOW + 60)) == 200
    assert _raw_rows(store, "SELECT count(*) FROM leases WHERE expires = 1001.0") == [(200,)]
    assert _raw_rows(store, "SELECT holder, expires FROM holders") == [("me", NOW + 60)]


def test_heartbeats_a_day_stale_are_pruned(store: SessionStore, make_header: MakeHeader) -> None:
    """A process that ended leaves its heartbeat row; a renewal removes the ones that
    lapsed more than a day before it (their leases lapsed with them: removing the
    row changes no lease's liveness)."""
    if not isinstance(store, (SqliteStore, PostgresStore)):
        pytest.skip("the memory store has no rows")
    h = make_header()
    store.create_session(h)
    store.acquire_lease(h.id, "gone", now=NOW, expires=NOW + 1)
    store.renew_lease_count("gone", NOW + 30)
    store.renew_lease_count("me", NOW + 30 + 86_400)
    assert _raw_rows(store, "SELECT holder FROM holders ORDER BY holder") == [("gone",), ("me",)]
    store.renew_lease_count("me", NOW + 31 + 86_400)
    assert _raw_rows(store, "SELECT holder FROM holders") == [("me",)]
    assert store.acquire_lease(h.id, "me", now=NOW + 31, expires=NOW + 60).epoch == 2


# -- migration ------------------------------------------------------------------------------

_OLD_LEASE = "INSERT INTO leases (session, holder, epoch, expires, wake) VALUES (?, ?, ?, ?, NULL)"


def test_an_sqlite_file_of_the_previous_version_keeps_its_leases(
    tmp_path: Path, make_header: MakeHeader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version-3 file (leases without heartbeats) opens as the current version: its
    leases live by their own expiry, as a process of the previous version renews
    them, and its renewals now use the heartbeat."""
    path = tmp_path / "v3.db"
    h = make_header()
    with monkeypatch.context() as m:
        m.setattr(_schema, "MIGRATIONS", _schema.MIGRATIONS[:3])
        m.setattr(_schema, "SCHEMA_VERSION", 3)
        with SqliteStore(path) as old:
            old.create_session(h)
    conn = sqlite3.connect(path)
    try:  # the lease a process of version 3 took
        conn.execute(_OLD_LEASE, (h.id.to_bytes(), "old", 1, NOW + 10))
        conn.commit()
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_schema")}
    finally:
        conn.close()
    assert "holders" not in names
    with SqliteStore(path) as store:
        _held(store, h.id, by="new", at=NOW + 5)
        assert store.acquire_lease(h.id, "new", now=NOW + 10, expires=NOW + 20).epoch == 2
        assert store.renew_lease_count("new", NOW + 90) == 1
        _held(store, h.id, by="old", at=NOW + 80)
    assert _raw_rows_at(path, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert _raw_rows_at(path, "SELECT holder FROM holders") == [("new",)]


def test_a_postgres_schema_of_the_previous_version_keeps_its_leases(
    pg_url: str, make_header: MakeHeader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on PostgreSQL: a version-1 schema migrates to the heartbeat table."""
    h = make_header()
    previous: Callable[..., Any] = _pg_schema.PG_MIGRATIONS[0]
    with monkeypatch.context() as m:
        m.setattr(_pg_schema, "PG_MIGRATIONS", (previous,))
        m.setattr(_pg_schema, "PG_SCHEMA_VERSION", 1)
        with PostgresStore(pg_url) as old:
            old.create_session(h)
            with psycopg.connect(_server(old), autocommit=True) as pg:
                pg.execute(f'SET search_path TO "{old.schema}"')
                pg.execute(_OLD_LEASE.replace("?", "%s"), (h.id.to_bytes(), "old", 1, NOW + 10))
    with PostgresStore(pg_url) as store:
        _held(store, h.id, by="new", at=NOW + 5)
        assert store.acquire_lease(h.id, "new", now=NOW + 10, expires=NOW + 20).epoch == 2
        assert store.renew_lease_count("new", NOW + 90) == 1
        _held(store, h.id, by="old", at=NOW + 80)
        assert _raw_rows(store, "SELECT version FROM subagents_schema") == [
            (_pg_schema.PG_SCHEMA_VERSION,)
        ]
        assert _raw_rows(store, "SELECT holder FROM holders") == [("new",)]


# -- the race: a heartbeat against a takeover ---------------------------------------------


def _renew_while_taken(a: SessionStore, b: SessionStore, session_id: Any, base: float) -> Any:
    """A renews while B tries to take ``session_id`` over, released at one barrier:
    B's lease, or None when B found it held."""
    barrier = threading.Barrier(2)
    taken: list[Any] = []

    def renew() -> None:
        barrier.wait()
        a.renew_lease_count("A", base + 60)

    def take() -> None:
        barrier.wait()
        try:
            taken.append(b.acquire_lease(session_id, "B", now=base + 10, expires=base + 40))
        except SubagentError as exc:
            assert exc.code == ErrorCode.LEASE_HELD
            taken.append(None)

    run_threads([renew, take])
    return taken[0]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_heartbeat_racing_a_takeover_leaves_one_writer(
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    make_header: MakeHeader,
    make_events: MakeEvents,
) -> None:
    """Issue 13 point 4, the authority rule under a race: holder A renews (its last
    heartbeat lapsed) while holder B, on another connection, takes the session over
    at the same moment. Whichever commits first, exactly one of the two can write
    fenced afterwards, and A's renewal count says whether it kept the lease -- or
    A's next count does (a count read before B's takeover committed). 40 rounds."""
    stores: list[SessionStore] = []
    if kind == "sqlite":
        stores = [SqliteStore(tmp_path / "race.db"), SqliteStore(tmp_path / "race.db")]
    else:
        url = request.getfixturevalue("pg_url")
        stores = [PostgresStore(url), PostgresStore(url)]
    a, b = stores
    outcomes: Counter[str] = Counter()
    try:
        for round_ in range(40):
            h = make_header()
            a.create_session(h)
            base = NOW + 1000 * round_
            mine = a.acquire_lease(h.id, "A", now=base, expires=base + 1)
            a.renew_lease_count("A", base + 5)
            taken = _renew_while_taken(a, b, h.id, base)
            writers = []
            for name, store, token in (("A", a, mine.token()), ("B", b, taken and taken.token())):
                if token is None:
                    continue
                try:
                    store.append(h.id, make_events(1), lease=token)
                    writers.append(name)
                except SubagentError as exc:
                    assert exc.code == ErrorCode.LEASE_LOST
            assert writers == (["B"] if taken is not None else ["A"])
            lease = a.get_lease(h.id)
            assert lease is not None and lease.holder == writers[0]
            # A knows whether it still holds it by the next renewal's count at the latest.
            held = a.renew_lease_count("A", base + 70)
            assert held == (0 if taken is not None else 1)
            if taken is not None:
                b.release_lease(h.id, taken.token())
            else:
                a.release_lease(h.id, mine.token())
            outcomes["B took it" if taken is not None else "A kept it"] += 1
    finally:
        for s in stores:
            s.close()
    assert sum(outcomes.values()) == 40
