"""Corruption stays local at resume (issue 19 point 4), on both backends and both stores.

A parent whose log holds an event that does not decode refuses an ordinary resume
(``CORRUPT_RECORD``, naming the seq and the way out), and a follow-up addressed to
its child by the parent's id accepts nothing. A user authority reaches the child
by resuming the parent with ``damaged="skip"``: the agent is rebuilt around the
damaged row, which stays in the store untouched, and no turn number is reused. A
continuable child whose descriptor row is gone is ``DESCRIPTOR_CORRUPT``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from pgcluster import outside_sql
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    SessionId,
    SubagentError,
    TurnEnd,
    TurnStart,
    new_message_id,
)
from subagents.store import open_store

pytestmark = pytest.mark.timeout(60)

GARBAGE = b"\xc1\xc1"  # 0xc1 is never used by msgpack


_sql = outside_sql


def garble(db: str, session: SessionId, seq: int) -> None:
    n = _sql(
        db,
        "UPDATE events SET body = ? WHERE session = ? AND seq = ?",
        GARBAGE,
        session.to_bytes(),
        seq,
    )
    assert n == 1


def raw_body(db: str, session: SessionId, seq: int) -> bytes:
    if db.startswith("postgresql"):
        import psycopg

        base, _, schema = db.partition("?schema=")
        with psycopg.connect(base) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            row = conn.execute(
                "SELECT body FROM events WHERE session = %s AND seq = %s", (session.to_bytes(), seq)
            ).fetchone()
    else:
        with sqlite3.connect(db) as conn:
            row = conn.execute(
                "SELECT body FROM events WHERE session = ? AND seq = ?", (session.to_bytes(), seq)
            ).fetchone()
        conn.close()
    assert row is not None
    return bytes(row[0])


def pending(db: str, session: SessionId) -> list[Any]:
    with open_store(db) as store:
        return [e.event.content for e in store.pending(session)]


def build(db: str, backend: Backend, checkpoint: bool = False) -> tuple[SessionId, SessionId, int]:
    """A root with two finished turns and a continuable child; the seq of the
    root's first ``message`` event. Without ``checkpoint`` the root's checkpoint
    (written at its disposal) is taken away, as a crash before it leaves none:
    its resume reads the whole log."""
    with Runtime(db, backend=backend) as rt:
        root = rt.spawn("echo", label="root")
        child = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label="kid")
        ).child_id
        root.followup("first")
        root.followup("second")
        assert rt.wait_idle(10)
        rt.sessions.flush()
        records = rt.sessions.read(root.session_id)
    seq = next(r.seq for r in records if isinstance(r.event, MessageEvent))
    if not checkpoint:
        gone = _sql(db, "DELETE FROM checkpoints WHERE session = ?", root.session_id.to_bytes())
        assert gone == 1
    return root.session_id, child, seq


def test_a_damaged_parent_is_refused_and_resumed_around_the_damage(
    backend: Backend, db: str
) -> None:
    """Issue 19 point 4 (R-ERR-1): refused by default, nothing accepted by a
    follow-up through it; ``damaged="skip"`` reaches the child; the row stays."""
    root_id, child, seq = build(db, backend)
    garble(db, root_id, seq)
    with Runtime(db, backend=backend) as rt:
        with pytest.raises(SubagentError) as info:
            rt.agents.resume(root_id)
        assert info.value.code == ErrorCode.CORRUPT_RECORD
        assert f"seq {seq}" in str(info.value) and "damaged='skip'" in str(info.value)
        with pytest.raises(SubagentError) as info:
            rt.subagents.followup(str(root_id), child, "through a damaged parent")
        assert info.value.code == ErrorCode.CORRUPT_RECORD
        assert pending(db, child) == []  # an error: nothing accepted
        with pytest.raises(SubagentError) as info:
            rt.agents.resume(root_id, damaged="bogus")
        assert info.value.code == ErrorCode.INVALID_ARGUMENT

        root = rt.agents.resume(root_id, damaged="skip")
        assert root.damaged_seqs == (seq,)
        rt.subagents.followup(root, child, "reached")
        root.followup("the root goes on")
        assert rt.wait_idle(10)
        rt.sessions.flush()
        with open_store(db) as store:
            child_log = [r.event for r in store.read(child)]
            rows = list(store.scan(root_id))
    assert "reached" in [e.content for e in child_log if isinstance(e, MessageEvent)]
    assert raw_body(db, root_id, seq) == GARBAGE  # the damage stays where it is
    turns = [
        r.event.turn
        for r in rows
        if not isinstance(r, SubagentError) and isinstance(r.event, TurnStart)
    ]
    assert len(turns) == len(set(turns)), turns  # no turn number reused


def test_damage_behind_a_top_level_checkpoint_does_not_stop_its_resume(
    backend: Backend, db: str
) -> None:
    """A top-level agent spawned by model name checkpoints at its disposal; a row
    damaged before the checkpoint is not read by its resume (the checkpoint folds
    it), so the damage stays local to that row: the agent resumes whole, with its
    recorded model, its turns numbered on, while a scan still names the row.
    R-ERR-1."""
    root_id, child, seq = build(db, backend, checkpoint=True)
    garble(db, root_id, seq)
    with Runtime(db, backend=backend) as rt:
        root = rt.agents.resume(root_id)
        assert root.damaged_seqs == ()
        assert root.options.model == "echo"
        root.followup("after the damage")
        rt.subagents.followup(root, child, "reached")
        assert rt.wait_idle(10)
        rt.sessions.flush()
    with open_store(db) as store:
        rows = list(store.scan(root_id))
    assert [r.seq for r in rows if isinstance(r, SubagentError)] == [seq]
    ends = [
        r.event for r in rows if not isinstance(r, SubagentError) and isinstance(r.event, TurnEnd)
    ]
    assert [e.turn for e in ends] == list(range(len(ends)))
    assert ends[-1].output == "after the damage"


def test_a_child_without_its_descriptor_is_descriptor_corrupt(backend: Backend, db: str) -> None:
    """Issue 19 point 4: a continuable child whose descriptor row is deleted cannot
    say what it was: ``DESCRIPTOR_CORRUPT`` (not ``MODEL_NOT_FOUND``), nothing
    accepted, its parent and siblings unharmed."""
    root_id, child, _ = build(db, backend)
    assert _sql(db, "DELETE FROM events WHERE session = ? AND seq = 0", child.to_bytes()) == 1
    _sql(db, "DELETE FROM checkpoints")
    with Runtime(db, backend=backend) as rt:
        root = rt.agents.resume(root_id)
        with pytest.raises(SubagentError) as info:
            rt.subagents.followup(root, child, "lost?")
        assert info.value.code == ErrorCode.DESCRIPTOR_CORRUPT
        assert "descriptor is missing" in str(info.value)
        root.followup("still fine")
        assert root.wait_idle(10)
    assert pending(db, child) == []


def _refused(db: str, backend: Backend, root_id: SessionId, child: SessionId) -> list[Any]:
    """The errors of a follow-up to ``child`` by its resumed parent and by its id."""
    _sql(db, "DELETE FROM checkpoints")
    errors: list[Any] = []
    with Runtime(db, backend=backend) as rt:
        root = rt.agents.resume(root_id)
        for parent in (root, str(root_id)):
            with pytest.raises(SubagentError) as info:
                rt.subagents.followup(parent, child, "lost?")
            errors.append(info.value)
    assert pending(db, child) == []
    return errors


def test_a_child_whose_descriptor_does_not_decode_is_descriptor_corrupt(
    backend: Backend, db: str
) -> None:
    """The same for a descriptor row that is there but does not decode: it was
    ``CORRUPT_RECORD``, with a way out (``resume(..., damaged='skip')``) that a
    subagent's session refuses. A damaged row elsewhere in a child's log is
    ``CORRUPT_RECORD`` and offers no such way."""
    root_id, child, _ = build(db, backend)
    garble(db, child, 0)
    for error in _refused(db, backend, root_id, child):
        assert error.code == ErrorCode.DESCRIPTOR_CORRUPT, error
        assert "does not decode" in str(error)
    root_id, child, _ = build(db, backend)
    garble(db, child, 1)
    for error in _refused(db, backend, root_id, child):
        assert error.code == ErrorCode.CORRUPT_RECORD, error
        assert "damaged='skip'" not in str(error)


def test_a_damaged_inbox_row_does_not_hide_the_others(
    backend: Backend, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Corruption stays local in the durable inbox too: of three accepted messages the
    middle one's row does not decode; a resume runs the other two in order, logs the
    damaged place once, and leaves the row in the store (it raised CORRUPT_RECORD
    and no message of the session could run)."""
    with Runtime(db, backend=backend) as rt:
        sid = rt.spawn("echo", label="inbox").session_id
    with open_store(db) as store:
        store.accept(
            sid, [MessageEvent(message_id=new_message_id(), content=f"m{i}") for i in range(3)]
        )
        places = [e.n for e in store.pending(sid)]
    assert _sql(db, "UPDATE inbox SET body = ? WHERE session = ? AND n = ?", GARBAGE,
                sid.to_bytes(), places[1]) == 1  # fmt: skip
    with caplog.at_level("ERROR", logger="subagents"), Runtime(db, backend=backend) as rt:
        agent = rt.agents.resume(sid)
        assert agent.wait_idle(10)
        rt.sessions.flush()
        ran = [r.event.content for r in rt.sessions.read(sid) if isinstance(r.event, MessageEvent)]
    assert ran == ["m0", "m2"]
    logged = [r for r in caplog.records if "do not decode" in r.getMessage()]
    assert len(logged) == 1 and str(places[1]) in logged[0].getMessage()
    with open_store(db) as store:
        damaged: list[int] = []
        assert store.pending(sid, damaged=damaged) == [] and damaged == [places[1]]
