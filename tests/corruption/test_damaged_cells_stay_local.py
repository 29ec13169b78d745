"""One damaged cell, written by another program or a damaged disk, stays one
session's problem (corruption kept local; R-ERR-*: typed errors at the bytes
boundary; R-LIST-15/16: a listing goes on).

Each store-wide question a sweep or a listing asks read every row's session key
as if the store had written it: one inbox row keyed by 15 bytes, text or a
number raised an untyped error and no orphan of any session was found any more;
one lease row with a NUL in its wake address failed every ``ended_work``; one
child row with a text ``created_at`` failed a listing of over 500 parents; a
damaged cached identity was served as a row (and the ``tree`` command failed on
it); a damaged ``schema_version`` raised ``ValueError`` from every open.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._shell._cli import main
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    SessionHeader,
    SubagentError,
    new_message_id,
    new_session_id,
    packb,
)
from subagents.store import SqliteStore


def _header(parent: Any = None) -> SessionHeader:
    return SessionHeader(
        id=new_session_id(),
        parent_session=parent,
        origin="user" if parent is None else "subagent",
        delegation_depth=0 if parent is None else 1,
        created_at=dt.datetime.now(dt.UTC),
    )


def _damage(path: Path, sql: str, *params: Any) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize("key", ["x'0102'", "'abc'", "-3"])
def test_one_damaged_inbox_key_leaves_every_other_orphan_found(tmp_path: Path, key: str) -> None:
    path = tmp_path / "s.db"
    with SqliteStore(path) as store:
        a, b = _header(), _header()
        store.create_session(a)
        store.create_session(b)
        mid = new_message_id()
        store.accept(a.id, [MessageEvent(message_id=mid, content="to a")])
        store.accept(b.id, [MessageEvent(message_id=new_message_id(), content="to b")])
    _damage(path, f"UPDATE inbox SET session = {key} WHERE session = ?", a.id.to_bytes())
    with SqliteStore(path) as store:
        assert store.orphans(time.time()) == [b.id]
        assert store.find_accepted(mid) == []
        assert len(store.pending(b.id)) == 1


def test_one_damaged_lease_row_leaves_the_others_work_found(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    now = time.time()
    with SqliteStore(path) as store:
        a, b = _header(), _header()
        for h in (a, b):
            store.create_session(h)
            store.acquire_lease(h.id, "host:1:x", now=now, expires=now + 1e6, wake="/tmp/none")
            store.accept(h.id, [MessageEvent(message_id=new_message_id(), content="m")])
    _damage(
        path,
        "UPDATE leases SET holder = CAST('host:1:x' AS BLOB), wake = '/tmp/a' || char(0) || 'b'"
        " WHERE session = ?",
        a.id.to_bytes(),
    )
    with SqliteStore(path) as store:
        assert store.leased_work("host:", time.time()) == [(b.id, "host:1:x")]
        assert store.ended_work(time.time()) == []


@pytest.mark.parametrize("damage", ["created_at = 'garbage'", "id = -5"])
def test_a_listing_of_many_parents_reads_past_one_damaged_child_row(
    tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "s.db"
    with SqliteStore(path) as store:
        parents = [_header() for _ in range(501)]  # more than one statement's worth
        for p in parents:
            store.create_session(p)
        kids = [_header(parents[0].id), _header(parents[-1].id)]
        for k in kids:
            store.create_session(k)
    _damage(path, f"UPDATE sessions SET {damage} WHERE id = ?", kids[0].id.to_bytes())
    with SqliteStore(path) as store:
        found = store.scan_children([p.id for p in parents])
    assert len(found) == 2  # the damaged one as its CorruptRecordError, or read past


def test_a_damaged_cached_identity_is_a_miss_and_the_log_decides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.db"
    with Runtime(str(path)) as rt:
        rt.models.register("worker", lambda _o: lambda turn: "w")
        root = rt.spawn("echo", label="root")
        spec = ContinuableStartSpec(
            parent=root, provider="local", prompt="x", label="kid", model="worker"
        )
        rt.subagents.start_continuable(spec)
        assert rt.wait_idle(30)
        root_id = root.session_id
    bad = {"mode": ["not", "a", "mode"], "label": {"b": b"\xff"}}
    _damage(path, "UPDATE projection_cache SET data = ? WHERE unit = 'subagent'", packb(bad))
    with Runtime(str(path)) as rt:
        listing = rt.subagents.list_children(root_id)
        assert [(r.mode, r.label) for r in listing.rows] == [("continuable", "kid")]
        assert listing.diagnostics == ()
    assert main(["tree", str(path)]) == 0
    assert "kid" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["'abc'", "NULL", "-2", "2.5", "x'01'"])
def test_a_damaged_schema_version_is_refused_typed_and_untouched(
    tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE schema_version")
    conn.execute("CREATE TABLE schema_version (version)")  # another program's table
    conn.execute(f"INSERT INTO schema_version VALUES ({value})")
    conn.commit()
    before = conn.execute("SELECT name FROM sqlite_schema ORDER BY name").fetchall()
    conn.close()
    with pytest.raises(SubagentError) as info:
        SqliteStore(path)
    assert info.value.code == ErrorCode.NOT_A_DATABASE
    for command in (["tree", str(path)], ["show", str(path), str(new_session_id())]):
        assert main(command) == 2
    assert "NOT_A_DATABASE" in capsys.readouterr().err
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT name FROM sqlite_schema ORDER BY name").fetchall() == before
    conn.close()


def test_last_seq_of_a_damaged_seq_is_a_corrupt_record(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SqliteStore(path) as store:
        h = _header()
        store.create_session(h, [MessageEvent(message_id=new_message_id(), content="m")])
    _damage(path, "UPDATE events SET seq = 'x' WHERE session = ?", h.id.to_bytes())
    with SqliteStore(path) as store, pytest.raises(SubagentError) as info:
        store.last_seq(h.id)
    assert info.value.code == ErrorCode.CORRUPT_RECORD
