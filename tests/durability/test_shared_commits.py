"""A turn's records share the next acceptance's commit (issue 20: the durable rows
keep their ratios; R-S7: accepted means committed).

With follow-ups accepted while their turns run, the write-behind of each turn's
records (nobody waits for it) took a transaction -- an fsync -- of its own between
two acceptances. Now it lingers, at most as long as a commit takes, for the next
acceptance to share one; a flush (somebody waiting for it) hurries it. Both
stores (SQLite, PostgreSQL), both backends.
"""

from __future__ import annotations

from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.store._group import GroupCommitter

pytestmark = pytest.mark.timeout(120)


def test_follow_ups_while_their_turns_run_take_one_transaction_each(
    backend: Backend, db: str
) -> None:
    """One producer, its agent running each message as it comes: about one
    transaction a message (two before), every message run and logged once."""
    with Runtime(db, backend=backend) as rt:
        rt.models.register("sink", lambda _o: lambda turn: turn.content)
        agent = rt.spawn("sink")
        store: Any = rt.sessions.persistence
        agent.followup("warm")
        assert agent.wait_idle(30)
        rt.sessions.flush(agent.session_id, timeout=30)
        before = store.statistics().transactions
        n = 200
        for i in range(n):
            agent.followup(i)
        assert agent.wait_idle(60)
        rt.sessions.flush(agent.session_id, timeout=30)
        used = store.statistics().transactions - before
        # Two a message before (each turn's records alone between two acceptances);
        # shared, about one (a commit that outran the next acceptance is alone).
        assert used <= 1.5 * n, used
        outputs = [
            r.event.output for r in rt.sessions.read(agent.session_id) if r.event.type == "turn/end"
        ]
        assert outputs == ["warm", *range(n)]


def test_a_flush_hurries_the_records_lingering_for_an_acceptance(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The linger made a minute long: the records of the turn after an acceptance
    wait for a next acceptance that never comes -- until a flush waits for them,
    which ends the wait at once."""
    monkeypatch.setattr("subagents.store._group.LINGER_MAX", 60.0)
    spent = property(lambda self: 60.0, lambda self, value: None)  # every commit "a minute"
    monkeypatch.setattr(GroupCommitter, "_spent", spent, raising=False)
    with Runtime(db, backend=backend) as rt:
        ran = backend.event()
        rt.models.register("mark", lambda _o: lambda turn: ran.set())
        agent = rt.spawn("mark")
        committer: Any = rt.sessions.persistence._committer
        for _ in range(3):
            ran.clear()
            agent.followup("x")  # an acceptance: the next lazy batch lingers
            assert ran.wait(30) and agent.wait_idle(30)
            rt.sessions.flush(agent.session_id, timeout=30)  # TIMEOUT if not hurried
            assert not committer._lingering


def test_a_write_many_patched_on_the_store_object_is_what_the_write_behind_calls(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store whose ``write_many`` was replaced on the object (a fault injection,
    a user's instrumentation) sees the runtime's write-behind of every turn, as a
    subclass's override does: the lazy path does not go around it."""
    with Runtime(db, backend=backend) as rt:
        rt.models.register("sink", lambda _o: lambda turn: turn.content)
        agent = rt.spawn("sink")
        store: Any = rt.sessions.persistence
        original = store.write_many
        seen: list[str] = []

        def write_many(ops: Any) -> Any:
            seen.extend(op[0] for op in ops)
            return original(ops)

        monkeypatch.setattr(store, "write_many", write_many)
        for i in range(3):
            agent.followup(i)
            assert agent.wait_idle(30)
        rt.sessions.flush(agent.session_id, timeout=30)
        assert "append" in seen
