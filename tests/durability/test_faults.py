"""Store faults at the runtime's boundary (issue 13 point 8), on both backends.

A store that cannot commit -- disk full (SQLite's ``max_page_count``, a real
``SQLITE_FULL``), a database another process keeps locked past the busy
timeout, an I/O error (injected where SQLite would raise it, at the connection)
-- makes the accepting call raise a typed error: the message is not accepted
(no turn runs it, the inbox does not hold it), and what was accepted before the
fault is still there and still runs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from durability_kit import Noted
from subagents.actors import Agent, Runtime
from subagents.actors._kernel import Gate
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, SubagentError
from subagents.store import SqliteStore


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "faulty.db"


@pytest.fixture
def setup(backend: Backend, db: Path) -> Iterator[tuple[Runtime, SqliteStore, Noted]]:
    store = SqliteStore(db, busy_timeout_s=0.2)
    noted = Noted()
    with Runtime(store, backend=backend) as rt:
        noted.register(rt, "rt")
        yield rt, store, noted


def _pending(db: Path, agent: Agent) -> list[Any]:
    other = SqliteStore(db)
    try:
        return [e.event.content for e in other.pending(agent.session_id)]
    finally:
        other.close()


def _accepted_nothing(rt: Runtime, db: Path, agent: Agent, noted: Noted, ran: list[Any]) -> None:
    assert agent.wait_idle(10)
    assert noted.contents() == ran
    assert _pending(db, agent) == []


class _FailingConnection:
    """The store's connection, with COMMIT failing as a disk I/O error would."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("disk I/O error")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_disk_full_refuses_the_message_and_keeps_the_earlier_ones(
    setup: tuple[Runtime, SqliteStore, Noted], db: Path
) -> None:
    """Issue 13 point 8: SQLITE_FULL is ``PERSISTENCE_UNAVAILABLE``; nothing accepted."""
    rt, store, noted = setup
    agent = rt.spawn("note")
    agent.followup("before")
    assert agent.wait_idle(10)
    rt.sessions.flush()
    conn = store._writer.conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    try:
        with pytest.raises(SubagentError) as err:
            agent.followup("x" * 200_000)
        assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert "full" in str(err.value)
        _accepted_nothing(rt, db, agent, noted, ["before"])
    finally:
        conn.execute("PRAGMA max_page_count = 1073741823")
    agent.followup("after")
    assert agent.wait_idle(10)
    assert noted.contents() == ["before", "after"]


def test_a_database_locked_past_the_timeout_is_a_timeout_and_nothing_accepted(
    setup: tuple[Runtime, SqliteStore, Noted], db: Path
) -> None:
    """Issue 13 point 8: another process holds the write lock: ``TIMEOUT``."""
    rt, _, noted = setup
    agent = rt.spawn("note")
    agent.followup("before")
    assert agent.wait_idle(10)
    rt.sessions.flush()  # its turn/end is committed: the lock comes after
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(SubagentError) as err:
            agent.followup("locked out")
        assert err.value.code == ErrorCode.TIMEOUT
        with pytest.raises(SubagentError) as err:
            rt.spawn("note")
        assert err.value.code == ErrorCode.TIMEOUT
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    _accepted_nothing(rt, db, agent, noted, ["before"])
    assert [h.id for h in rt.agents.roots()] == [agent.session_id]  # no half-made agent
    assert [a.session_id for a in rt.agents.list()] == [agent.session_id]


def test_an_io_error_refuses_the_message_and_what_waits_still_runs(
    setup: tuple[Runtime, SqliteStore, Noted], db: Path
) -> None:
    """Issue 13 point 8: an I/O error at commit is ``PERSISTENCE_UNAVAILABLE``; the
    messages accepted before it -- one running, one queued behind it -- run."""
    rt, store, noted = setup
    gate = _register_gated(rt)
    agent = rt.spawn("gated")
    agent.followup("first")
    agent.followup("second")
    assert gate.wait_reached()
    rt.sessions.flush()  # the turn/start is in: only the refused message meets the fault
    writer = store._writer
    real = writer.conn
    writer.conn = _FailingConnection(real)  # type: ignore[assignment]
    try:
        with pytest.raises(SubagentError) as err:
            agent.followup("refused")
        assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert isinstance(err.value.__cause__, sqlite3.OperationalError)
    finally:
        writer.conn = real
    gate.release()
    assert agent.wait_idle(10)
    rt.sessions.flush()
    assert noted.contents() == ["first", "second"]
    assert _pending(db, agent) == []


def test_a_failed_write_behind_stops_the_agent_and_the_next_activation_replays(
    backend: Backend, db: Path
) -> None:
    """Issue 13 point 8: a turn whose log write fails (the store broke while it ran)
    cannot know what was stored: its agent stops (``PERSISTENCE_UNAVAILABLE`` after,
    naming the failure: issue 19 point 2), its
    lease goes back, and the next activation runs what was accepted and not done
    -- flagged ``redelivered``; nothing is lost."""
    noted = Noted()
    store = SqliteStore(db)
    with Runtime(store, backend=backend) as rt:
        noted.register(rt, "one")
        gate = _register_gated(rt)
        agent = rt.spawn("gated")
        agent.followup("first")
        agent.followup("second")
        assert gate.wait_reached()
        rt.sessions.flush()
        writer = store._writer
        real = writer.conn
        writer.conn = _FailingConnection(real)  # type: ignore[assignment]
        gate.release()
        assert agent.wait_disposed(10)
        writer.conn = real
        with pytest.raises(SubagentError) as err:
            agent.followup("late")
        assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert "disk I/O error" in str(err.value)
        sid = agent.session_id
    # Refused while the store failed, the lease release was retried (at the latest
    # by close): the session is free for its next activation.
    assert _lease_holder(db, sid) is None
    assert _pending_of(db, sid) == ["first", "second"]
    with Runtime(str(db), backend=backend) as rt:
        noted.register(rt, "two")
        rt.models.register("gated", rt.models.require("note"), replace=True)
        again = rt.agents.resume(sid)
        assert again.wait_idle(10)
    assert [i for i in noted.items() if i[0] == "two"] == [
        ("two", "first", True),
        ("two", "second", True),
    ]
    assert _pending_of(db, sid) == []


def _register_gated(rt: Runtime) -> Gate:
    """The ``gated`` model: the ``note`` model, whose turn of ``"first"`` waits at the
    returned gate."""
    gate = Gate("first turn")
    note = rt.models.require("note")

    def gated(options: Any) -> Any:
        inner = note(options)

        def on_turn(turn: Any) -> Any:
            if turn.content == "first":
                gate.pass_through(turn.signal)
            return inner(turn)

        return on_turn

    rt.models.register("gated", gated, replace=True)
    return gate


def _lease_holder(db: Path, sid: Any) -> Any:
    other = SqliteStore(db)
    try:
        lease = other.get_lease(sid)
        return None if lease is None else lease.holder
    finally:
        other.close()


def _pending_of(db: Path, sid: Any) -> list[Any]:
    other = SqliteStore(db)
    try:
        return [e.event.content for e in other.pending(sid)]
    finally:
        other.close()
