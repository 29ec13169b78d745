"""``subagents tree`` reads a big store in a bounded number of statements.

On a read-only store no listing caches an identity it folded, so every session
without an identity row was inspected on its own (its log, then its header: two
round trips), and every session whose log shows an open turn had its lease read
alone, besides one lease read (and, on PostgreSQL, one clock read) per tree. On
PostgreSQL 5,000 sessions took 18 s. Now a frame is a few statements per window
of sessions, and each log is read and decoded once.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from subagents.actors._shell._cli import _open_existing
from subagents.actors._shell._tree import collect_trees
from subagents.protocol import (
    ContinuableDescriptor,
    CorruptRecordError,
    MessageEvent,
    SessionHeader,
    SessionId,
    TurnEnd,
    TurnStart,
    descriptor_event,
    new_message_id,
    new_session_id,
)
from subagents.store import open_store

pytestmark = pytest.mark.timeout(120)

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
TREES, CHILDREN = 30, 9


def _build(db: str) -> dict[str, Any]:
    """``TREES`` roots with ``CHILDREN`` continuable children each, no identity
    cached; the first child of each tree has a turn open and a live lease, the
    second a message waiting in its durable inbox."""
    store = open_store(db)
    assert store is not None
    n = 0
    opened, waiting = [], []
    now = time.time()
    try:
        for t in range(TREES):
            n += 1
            root = SessionHeader(
                id=new_session_id(),
                parent_session=None,
                origin="user",
                delegation_depth=0,
                created_at=T0 + dt.timedelta(seconds=n),
                label=f"root{t}",
            )
            store.create_session(root)
            for c in range(CHILDREN):
                n += 1
                label = f"t{t}c{c}"
                d = ContinuableDescriptor(
                    provider="local", label=label, agent_provider="local", model="echo"
                )
                head = SessionHeader(
                    id=new_session_id(),
                    parent_session=root.id,
                    origin="subagent",
                    delegation_depth=1,
                    created_at=T0 + dt.timedelta(seconds=n),
                    label=label,
                )
                mid = new_message_id()
                events: list[Any] = [
                    descriptor_event(d),
                    TurnStart(turn=0, at=T0 + dt.timedelta(seconds=n), message_ids=(mid,)),
                    MessageEvent(message_id=mid, content="go"),
                ]
                if c != 0:
                    events.append(
                        TurnEnd(
                            turn=0, at=T0 + dt.timedelta(seconds=n + 1), stop_reason="completed"
                        )
                    )
                store.create_session(head, events)
                if c == 0:
                    store.acquire_lease(head.id, "alive", now=now, expires=now + 3600)
                    opened.append(str(head.id))
                elif c == 1:
                    store.accept(head.id, [MessageEvent(message_id=new_message_id(), content="x")])
                    waiting.append(str(head.id))
        store.flush()
    finally:
        store.close()
    return {"opened": opened, "waiting": waiting}


def test_a_frame_is_a_bounded_number_of_statements(db: str) -> None:
    """R-LIST-10, R-LIST-11, R-LIST-2: 300 sessions without a cached identity in 30
    trees are read in a handful of statements (each log once), on SQLite and
    PostgreSQL; what is shown is what each session's log, inbox and lease say, and
    a log with a row that does not decode, read in a batch, is the ``corrupt``
    diagnostic a read of it alone gives (its row left out)."""
    made = _build(db)
    victim = made["waiting"][-1]
    _damage(db, SessionId(victim))
    store = _open_existing(db)
    with pytest.raises(CorruptRecordError) as alone:
        store.read(victim)
    statements: list[str] = []
    query = store._query

    def counted(sql: str, params: Any) -> Any:
        statements.append(sql)
        return query(sql, params)

    store._query = counted  # type: ignore[method-assign]
    try:
        trees = collect_trees(store, db, None)
    finally:
        store.close()
    rows = {r["id"]: r for tree in trees for r in tree["descendants"]}
    assert len(trees) == TREES and len(rows) == TREES * CHILDREN - 1
    diags = [d for tree in trees for d in tree["diagnostics"]]
    assert [(d["id"], d["kind"], d["detail"]) for d in diags] == [
        (victim, "corrupt", str(alone.value))
    ]
    assert {rows[s]["state"] for s in made["opened"]} == {"running"}
    assert {rows[s]["activity"] for s in made["opened"]} == {"running"}
    assert {(rows[s]["state"], rows[s]["inbox"]) for s in made["waiting"][:-1]} == {("waiting", 1)}
    # It was 2 a session (its log, its header), 1 more for each open turn's lease,
    # and 1 or 2 a tree: 648 on SQLite, 678 on PostgreSQL.
    assert len(statements) <= 12, statements
    # Every log read once: the children's where the listing finds their identities,
    # the roots' with the window.
    logs = [s for s in statements if "events" in s]
    assert len(logs) == 2, logs


def _damage(db: str, victim: Any) -> None:
    """Make ``victim``'s event at seq 2 undecodable, behind the store's back."""
    if db.startswith("postgresql"):
        import psycopg

        base, _, query = db.partition("?")
        schema = query.split("schema=")[1].split("&")[0]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(
                f'UPDATE "{schema}".events SET body = %s WHERE session = %s AND seq = 2',
                (b"\xc1", victim.to_bytes()),
            )
    else:
        import sqlite3

        conn = sqlite3.connect(db)
        with conn:
            conn.execute(
                "UPDATE events SET body = x'c1' WHERE session = ? AND seq = 2", (victim.to_bytes(),)
            )
        conn.close()
