"""No persistence failure is silent (issue 19 point 2), on both backends and both stores.

A session whose write-behind write fails -- here the store itself refuses its
rows: a trigger installed from outside, a real error from SQLite or PostgreSQL
-- stops: its agent is disposed, its next ``followup`` raises
``PERSISTENCE_UNAVAILABLE`` naming the failure, ``runtime.sessions.statistics()``
lists it, and every other session goes on writing. Activated again once the store
takes its rows, it starts over from what the store holds: under strict durability
the accepted message that never finished runs again (R-DUR-* of issue 13), under
relaxed durability what was only in memory is gone, as documented.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from refusal_kit import allow, refuse
from subagents.actors import Runtime
from subagents.actors._agents._sessions import SessionService
from subagents.actors._kernel._backend import Backend
from subagents.actors._kernel._gate import Latch
from subagents.protocol import ErrorCode, MessageEvent, SessionId, SubagentError, TurnEnd
from subagents.store import SqliteStore, open_store

pytestmark = pytest.mark.timeout(60)


def inject(db: str, session: SessionId) -> None:
    """Make the store refuse every new event row of ``session`` (a real store error)."""
    refuse(db, session, table="events")


def heal(db: str) -> None:
    allow(db, table="events")


def durable(db: str, session: SessionId) -> list[Any]:
    with open_store(db) as store:
        return [r.event for r in store.read(session)]


def contents(events: list[Any]) -> list[Any]:
    return [e.content for e in events if isinstance(e, MessageEvent)]


def turns_ended(events: list[Any]) -> int:
    return sum(isinstance(e, TurnEnd) for e in events)


@pytest.mark.parametrize("durability", ["strict", "relaxed"])
def test_a_failed_write_stops_its_session_and_only_it(
    backend: Backend, db: str, durability: str
) -> None:
    """Issue 19 point 2: the failing session stops accepting with a typed error and
    is listed in ``statistics()``; its sibling goes on; activated again after the
    store recovered, it starts from the store (strict: replaying the lost turn)."""
    with Runtime(db, backend=backend, durability=durability) as rt:
        a = rt.spawn("echo", label="a")
        b = rt.spawn("echo", label="b")
        a.followup("one")
        assert a.wait_idle(10)
        rt.sessions.flush(a.session_id)
        inject(db, a.session_id)

        a.followup("two")  # accepted: the inbox takes it, the turn's writes fail
        assert a.wait_disposed(10)
        with pytest.raises(SubagentError) as info:
            a.followup("three")
        assert info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert "injected write failure" in str(info.value)
        stats = rt.sessions.statistics()
        assert [f.session_id for f in stats.persistence_failures] == [a.session_id]
        assert stats.persistence_failures[0].code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert stats.failed_writes == 1
        assert stats.store is not None and stats.store.transactions > 0
        with pytest.raises(SubagentError) as info:  # the failure's own code: not INTERNAL
            rt.sessions.flush(a.session_id)
        assert info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE

        b.followup("fine")  # the rest of the runtime goes on
        assert b.wait_idle(10)
        rt.sessions.flush(b.session_id)
        assert contents(durable(db, b.session_id)) == ["fine"]
        assert durable(db, a.session_id) == durable(db, a.session_id)  # still readable
        assert contents(durable(db, a.session_id)) == ["one"]

        heal(db)
        again = rt.agents.resume(a.session_id)
        assert rt.sessions.statistics().persistence_failures == ()
        again.followup("four")
        assert again.wait_idle(10)
        rt.sessions.flush(a.session_id)
        log = durable(db, a.session_id)
        if durability == "strict":  # accepted means committed: "two" runs again
            assert contents(log) == ["one", "two", "four"]
            assert turns_ended(log) == 3
        else:  # relaxed: what was only in memory went with the failed activation
            assert contents(log) == ["one", "four"]
            assert turns_ended(log) == 2


def _follow_up_until_refused(rt: Runtime, agent: Any, round_: int) -> None:
    for i in range(100_000):
        agent.followup((round_, i))
        rt.backend.sleep(0)  # on gevent the turns and writes run meanwhile


@pytest.mark.parametrize("durability", ["strict", "relaxed"])
def test_followups_racing_a_failed_write_always_name_the_failure(
    backend: Backend, db: str, durability: str
) -> None:
    """Follow-ups sent back to back while the session's write fails: the first one
    refused is ``PERSISTENCE_UNAVAILABLE`` naming the failure, whichever check
    met the disposal (one that passed the disposed check and then met the closed
    gate said ``AGENT_DISPOSED``). Ten rounds, each on a freshly resumed agent."""
    with Runtime(db, backend=backend, durability=durability) as rt:
        agent = rt.spawn("echo", label="a")
        sid = agent.session_id
        for round_ in range(10):
            assert agent.wait_idle(10)
            rt.sessions.flush(sid)
            inject(db, sid)
            with pytest.raises(SubagentError) as info:
                _follow_up_until_refused(rt, agent, round_)
            assert info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE, info.value
            assert "injected write failure" in str(info.value)
            assert agent.wait_disposed(10)
            heal(db)
            agent = rt.agents.resume(sid)


def test_a_child_whose_writes_fail_is_reached_again_by_its_parent(
    backend: Backend, db: str
) -> None:
    """Issue 19 point 2, R-CONT-*: a continuable child's failed write stops the
    child, not its parent or siblings; the parent's next follow-up, once the store
    takes the rows again, cold-resumes it and every accepted message runs."""
    from subagents.actors import ContinuableStartSpec

    with Runtime(db, backend=backend) as rt:
        root = rt.spawn("echo")
        spec = ContinuableStartSpec(parent=root, provider="local", prompt="p", label="c")
        child = rt.subagents.start_continuable(spec).child_id
        sibling = rt.subagents.start_continuable(spec).child_id
        rt.wait_idle(10)
        rt.sessions.flush()
        inject(db, child)
        rt.subagents.followup(root, child, "lost turn")
        rt.subagents.followup(root, sibling, "sibling turn")
        assert rt.wait_idle(10)
        failures = rt.sessions.statistics().persistence_failures
        assert [f.session_id for f in failures] == [child]
        assert not root.disposed
        rt.sessions.flush(sibling)
        assert "sibling turn" in contents(durable(db, sibling))

        heal(db)
        rt.subagents.followup(root, child, "after")
        assert rt.wait_idle(10)
        rt.sessions.flush()
        log = contents(durable(db, child))
        assert log[-2:] == ["lost turn", "after"]
        assert rt.sessions.statistics().persistence_failures == ()


class _HeldStore(SqliteStore):
    """Holds the writer in one batch until ``go``; the batch after it fails whole."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.hold = False
        self.held = Latch()  # (waits right from a thread and from a greenlet)
        self.go = Latch()
        self.fail_next = False

    def write_many(self, ops: Any) -> Any:
        if self.hold:
            self.hold = False
            self.held.set()
            assert self.go.wait(30)
            self.fail_next = True
        elif self.fail_next:
            self.fail_next = False
            self.failed_batch = [op[0] for op in ops]
            raise OSError("the disk is gone")
        return super().write_many(ops)


def test_a_failed_batch_counts_each_session_once(backend: Backend, tmp_path: Any) -> None:
    """``failed_writes`` counts each failed session once per activation, as its
    docstring says: a whole write-behind batch that fails, holding several writes of
    each of two sessions, counts 2 (it counted every write: 6 and more)."""
    store = _HeldStore(str(tmp_path / "held.db"))
    with Runtime(store, backend=backend, durability="relaxed") as rt:
        a = rt.spawn("echo", label="a")
        b = rt.spawn("echo", label="b")
        for agent in (a, b):
            agent.followup("warm")
            assert agent.wait_idle(10)
        rt.sessions.flush()
        store.hold = True
        a.followup("held")
        assert store.held.wait(10)  # the writer is in that batch; the rest queue
        for i in range(3):  # interleaved: a, b, a, b, a, b
            for agent in (a, b):
                agent.followup(i)
                assert agent.wait_idle(10)
        store.go.set()
        assert a.wait_disposed(10) and b.wait_disposed(10)
        assert len(store.failed_batch) >= 6
        stats = rt.sessions.statistics()
        assert {f.session_id for f in stats.persistence_failures} == {a.session_id, b.session_id}
        assert stats.failed_writes == 2


@pytest.mark.parametrize(
    ("failure", "traced"),
    [
        (SubagentError("the server is down", code=ErrorCode.PERSISTENCE_UNAVAILABLE), False),
        (SubagentError("no longer ours", code=ErrorCode.LEASE_LOST), False),
        (RuntimeError("a bug"), True),
    ],
    ids=["outage", "lost", "bug"],
)
def test_a_disposal_whose_flush_fails_logs_a_traceback_only_for_a_bug(
    backend: Backend,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    failure: Exception,
    traced: bool,
) -> None:
    """A disposal's flush the store refuses (the server down mid-run: a typed error)
    is one line on the ``subagents`` logger, as a lost lease's is; it logged a full
    traceback. What is no ``SubagentError`` is a bug, and keeps its traceback."""
    with Runtime(str(tmp_path / "s.db"), backend=backend) as rt:
        agent = rt.spawn("echo")
        agent.followup("one")
        assert agent.wait_idle(10)

        def flush(self: Any, session_id: Any = None, timeout: Any = 30.0) -> None:
            raise failure

        monkeypatch.setattr(SessionService, "flush", flush)
        with caplog.at_level(logging.ERROR, logger="subagents"):
            agent.dispose()
            assert agent.wait_disposed(10)
        monkeypatch.undo()
    (record,) = [r for r in caplog.records if r.getMessage().startswith("flushing")]
    assert str(failure) in record.getMessage()
    assert bool(record.exc_info) == traced
