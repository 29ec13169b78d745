"""Open promises in the store (``store/_promises.py``): a session owed a message
(a background run's result, ``message/expected``) counts as accepted work for the
sweep while nobody holds it -- on every store (L-8: nothing promised is lost when
the process holding it dies; R-DUR-*: SQLite, PostgreSQL, memory), and in a store
migrated from the schema before promises (SQLite 4, PostgreSQL 2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeHeader
from subagents.protocol import ErrorCode, MessageId, SubagentError
from subagents.store import (
    SCHEMA_VERSION,
    PostgresStore,
    Promises,
    SessionStore,
    SqliteStore,
    _pg_schema,
    _schema,
)

NOW = 1_000.0
A, B = MessageId("a" * 32), MessageId("b" * 32)


def test_a_session_owed_a_message_is_accepted_work_while_nobody_holds_it(
    store: SessionStore, make_header: MakeHeader
) -> None:
    assert isinstance(store, Promises)
    h, other = make_header(), make_header()
    store.create_session(h)
    store.create_session(other)
    lease = store.acquire_lease(h.id, "me", now=NOW, expires=NOW + 30)
    store.owe(h.id, [A, B], lease=lease.token())
    assert sorted(store.owed(h.id)) == [A, B] and store.owed(other.id) == []
    assert store.orphans(NOW + 1) == []  # held: its holder runs it
    assert store.orphans(NOW + 31) == [h.id]  # its holder's lease lapsed
    store.owe(h.id, drop=[A], lease=lease.token())  # kept
    assert store.owed(h.id) == [B]
    # A stale holder writes nothing.
    store.acquire_lease(h.id, "you", now=NOW + 31, expires=NOW + 60)
    with pytest.raises(SubagentError) as lost:
        store.owe(h.id, drop=[B], lease=lease.token())
    assert lost.value.code == ErrorCode.LEASE_LOST
    assert store.owed(h.id) == [B]
    store.release_lease(h.id, ("you", 2))
    assert store.orphans(NOW + 32) == [h.id]  # released, still owed
    store.owe(h.id, [A], clear=True)  # clear first, then add
    assert store.owed(h.id) == [A]
    assert store.write_many([("owe", h.id, None, (), (), True)]) == [None]
    assert store.owed(h.id) == [] and store.orphans(NOW + 32) == []
    store.owe(h.id, [A])
    store.delete_session(h.id)  # its promises go with it
    assert store.orphans(NOW + 32) == []


def _migrated(store: SessionStore, sid: Any) -> None:
    store.owe(sid, [A])
    assert store.owed(sid) == [A] and store.orphans(NOW) == [sid]


def test_an_sqlite_file_of_the_previous_version_keeps_promises(
    tmp_path: Path, make_header: MakeHeader, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "v4.db"
    h = make_header()
    with monkeypatch.context() as m:
        m.setattr(_schema, "MIGRATIONS", _schema.MIGRATIONS[:4])
        m.setattr(_schema, "SCHEMA_VERSION", 4)
        with SqliteStore(path) as old:
            old.create_session(h)
    with SqliteStore(path) as store:
        _migrated(store, h.id)
    assert SCHEMA_VERSION == 5


def test_a_postgres_schema_of_the_previous_version_keeps_promises(
    pg_url: str, make_header: MakeHeader, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = make_header()
    previous: tuple[Callable[..., Any], ...] = _pg_schema.PG_MIGRATIONS[:2]
    with monkeypatch.context() as m:
        m.setattr(_pg_schema, "PG_MIGRATIONS", previous)
        m.setattr(_pg_schema, "PG_SCHEMA_VERSION", 2)
        with PostgresStore(pg_url) as old:
            old.create_session(h)
    with PostgresStore(pg_url) as store:
        _migrated(store, h.id)
    assert _pg_schema.PG_SCHEMA_VERSION == 3


def _delete_as_before_promises(path_or_url: str, sid: Any) -> None:
    """What a process of the schema before promises does to delete a session (it
    runs beside a migrated one until restarted): every row of it but its promises."""
    key = sid.to_bytes()
    tables = ("events", "checkpoints", "projection_cache", "inbox", "leases", "sessions")
    if path_or_url.startswith("postgresql"):
        import psycopg

        base, _, schema = path_or_url.partition("?schema=")
        with psycopg.connect(base, autocommit=True) as conn:
            for table in tables:
                column = "id" if table == "sessions" else "session"
                conn.execute(f'DELETE FROM "{schema}".{table} WHERE {column} = %s', (key,))
        return
    import sqlite3

    with sqlite3.connect(path_or_url) as conn:
        for table in tables:
            column = "id" if table == "sessions" else "session"
            conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (key,))


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_promises_of_a_session_an_older_process_deleted_are_no_work(
    kind: str, tmp_path: Path, make_header: MakeHeader, request: pytest.FixtureRequest
) -> None:
    """L-8, R-DUR-*: a session deleted by a process of the previous schema (which
    knows no promise rows) is no accepted work: the sweep does not find it, and
    adopt a session that is not there, every period."""
    where = str(tmp_path / "s.db") if kind == "sqlite" else request.getfixturevalue("pg_url")
    store: SessionStore = SqliteStore(where) if kind == "sqlite" else PostgresStore(where)
    with store:
        h, other = make_header(), make_header()
        store.create_session(h)
        store.create_session(other)
        store.owe(h.id, [A])
        store.owe(other.id, [B])
        assert sorted(store.orphans(NOW)) == sorted([h.id, other.id])
        _delete_as_before_promises(where, h.id)
        assert store.orphans(NOW) == [other.id]
