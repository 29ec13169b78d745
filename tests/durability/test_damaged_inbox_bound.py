"""A damaged inbox row costs only its own message, in a bounded inbox too.

docs/durability.md ("A damaged log"): the runtime skips a durable-inbox row that
does not decode and leaves it in the store. docs/backpressure.md: a bound counts
the messages accepted and not yet done. A skipped row is never done, so a bound
that counted it lost that place for good (a child bounded at one message never
took a follow-up again). The bound counts what ``pending()`` lists: the rows
that decode. Both backends, both stores.
"""

from __future__ import annotations

import datetime as dt

import pytest
from pgcluster import outside_sql
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import (
    InboxFullError,
    Limits,
    MessageEvent,
    SessionHeader,
    SessionId,
    TurnEnd,
    encode_event,
    new_message_id,
    new_session_id,
)
from subagents.store import PostgresStore, SessionStore, SqliteStore, open_store

pytestmark = pytest.mark.timeout(60)

GARBAGE = b"\xc1\xc1"  # 0xc1 is never used by msgpack
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def _damage(db: str, session: SessionId, n: int, body: bytes = GARBAGE) -> None:
    statement = "UPDATE inbox SET body = ? WHERE session = ? AND n = ?"
    assert outside_sql(db, statement, body, session.to_bytes(), n) == 1


def _message(content: str) -> MessageEvent:
    return MessageEvent(message_id=new_message_id(), content=content)


def test_a_damaged_inbox_row_takes_no_place_of_the_bound(db: str) -> None:
    """R-FUP-1: of three pending rows two do not decode (garbage; an event that is
    no message), so ``pending()`` lists one: a bound of 2 takes one more message,
    refuses the next with the count ``pending()`` gives (2, not 4), and once the
    messages that decode are done a bound of 1 takes a message again. The damaged
    rows stay in the store, untouched and named."""
    sid = new_session_id()
    header = SessionHeader(
        id=sid, parent_session=None, origin="user", delegation_depth=0, created_at=T0
    )
    first = [_message(f"m{i}") for i in range(3)]
    with open_store(db) as store:
        store.create_session(header)
        store.accept(sid, first)
    _damage(db, sid, 2)
    _damage(db, sid, 3, encode_event(TurnEnd(turn=0, at=T0, stop_reason="completed")))
    a, b = _message("a"), _message("b")
    with open_store(db) as store:
        damaged: list[int] = []
        assert [e.n for e in store.pending(sid, damaged=damaged)] == [1] and damaged == [2, 3]
        assert [x.duplicate for x in store.accept(sid, [a], limit=2)] == [False]
        with pytest.raises(InboxFullError) as err:
            store.accept(sid, [b], limit=2)
        assert (err.value.pending, err.value.limit) == (2, 2)
        assert len(store.pending(sid, damaged=[])) == 2
        store.complete(sid, [first[0].message_id, a.message_id])
        assert [x.duplicate for x in store.accept(sid, [b], limit=1)] == [False]
        with pytest.raises(InboxFullError) as err:
            store.accept(sid, [_message("c")], limit=1)
        assert (err.value.pending, err.value.limit) == (1, 1)
        damaged = []
        assert [e.message_id for e in store.pending(sid, damaged=damaged)] == [b.message_id]
        assert damaged == [2, 3]
    rows = outside_sql(db, "UPDATE inbox SET done = 0 WHERE session = ? AND body = ?",
                       sid.to_bytes(), GARBAGE)  # fmt: skip
    assert rows == 1  # still there, still undone, still its bytes


def test_a_bound_counts_what_the_stores_own_limits_decode(db: str) -> None:
    """R-FUP-1: a store opened with tighter decoding limits than the defaults names
    a pending message past them as damaged (``pending()`` skips it); its bound
    does not count it either, so both give the same count."""
    tight = Limits(max_str_len=64)
    store: SessionStore = (
        PostgresStore(db, limits=tight)
        if db.startswith("postgresql")
        else SqliteStore(db, limits=tight)
    )
    with store:
        sid = new_session_id()
        store.create_session(
            SessionHeader(
                id=sid, parent_session=None, origin="user", delegation_depth=0, created_at=T0
            )
        )
        store.accept(sid, [_message("x" * 1000)])
        damaged: list[int] = []
        assert store.pending(sid, damaged=damaged) == [] and damaged == [1]
        assert [x.duplicate for x in store.accept(sid, [_message("a")], limit=1)] == [False]
        with pytest.raises(InboxFullError) as err:
            store.accept(sid, [_message("b")], limit=1)
        assert err.value.pending == 1 == len(store.pending(sid, damaged=[]))


def _worker(_options: object) -> object:
    def on_turn(turn: object) -> object:
        return [m.content for m in turn.messages][-1]  # type: ignore[attr-defined]

    return on_turn


def test_a_child_bounded_at_one_takes_followups_past_a_damaged_row(
    backend: Backend, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """R-FUP-1: a continuable child bounded at one message whose durable inbox holds
    a row that does not decode (accepted while it was cold, then damaged) takes a
    follow-up by its parent (it was ``INBOX_FULL pending=1 limit=1`` for good):
    the follow-up resumes the child, which skips the row (logged once) and runs the
    message; once it settled, the next follow-up is accepted and runs too."""
    with Runtime(db, backend=backend) as rt:
        rt.models.register("worker", _worker)
        root = rt.spawn("echo")
        spec = ContinuableStartSpec(
            parent=root, provider="local", prompt="p", label="kid", model="worker", max_inbox=1
        )
        child, _ = rt.subagents.start_continuable(spec)
        assert rt.wait_idle(10)
        parent_id = root.session_id
    with open_store(db) as store:
        (lost,) = store.accept(child, [_message("lost")])
    _damage(db, child, lost.n)
    with caplog.at_level("ERROR", logger="subagents"), Runtime(db, backend=backend) as rt:
        rt.models.register("worker", _worker)
        parent = rt.agents.get(parent_id) or rt.agents.resume(parent_id)
        rt.subagents.followup(parent, child, "one")
        assert rt.wait_idle(10)
        rt.subagents.followup(parent, child, "two")
        assert rt.wait_idle(10)
        rt.sessions.flush()
        logged_events = [r.event for r in rt.sessions.read(child)]
        ran = [e.content for e in logged_events if isinstance(e, MessageEvent)]
    assert ran == ["p", "one", "two"]
    with open_store(db) as store:
        damaged: list[int] = []
        assert store.pending(child, damaged=damaged) == [] and damaged == [lost.n]
    logged = [r for r in caplog.records if "do not decode" in r.getMessage()]
    assert len(logged) == 1 and str(lost.n) in logged[0].getMessage()
