"""Durable ownership (issue 13 point 7): what a process created, any process finds.

A top-level agent spawned with a model name records it (``agent/options``), so
``agents.resume(session_id)`` rebuilds it in a new runtime; ``agents.roots()``
lists the top-level sessions of the store; ``agents.send`` messages one wherever
it is live -- here, resumed here, or in the runtime that holds it. Runtimes on one
file in one process stand in for processes here (their leases and doorbells are
their own); ``test_multiprocess.py`` runs real ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from durability_kit import Noted
from subagents.actors import (
    AbortSignal,
    AgentOptions,
    ContinuableStartSpec,
    Runtime,
    SubagentStartRequest,
)
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate, LifecycleProbe, wait_quiescent
from subagents.protocol import (
    AgentOptionsEvent,
    ErrorCode,
    MessageEvent,
    MessageId,
    SessionId,
    SubagentError,
    TurnEnd,
)
from subagents.store import open_store

M1 = "a1" * 16
SAME = "5a" * 16


@pytest.fixture
def noted() -> Noted:
    return Noted()


@pytest.fixture
def runtimes(backend: Backend, db: str, noted: Noted) -> Iterator[list[Runtime]]:
    """Two strict runtimes on one SQLite file, ``a`` and ``b``, with the note model."""
    made = []
    try:
        for name in ("a", "b"):
            rt = Runtime(db, backend=backend)
            noted.register(rt, name)
            made.append(rt)
        yield made
    finally:
        for rt in reversed(made):
            rt.close()


def _pending(db: str, sid: SessionId) -> list[object]:
    other = open_store(db)
    assert other is not None
    try:
        return [e.event.content for e in other.pending(sid)]
    finally:
        other.close()


def _ran(rt: Runtime, sid: SessionId) -> list[object]:
    """Contents of the messages of ``sid``'s completed turns, from the store."""
    assert rt.store is not None
    rt.sessions.flush()
    events = [r.event for r in rt.store.read(sid)]
    ended = sum(1 for e in events if isinstance(e, TurnEnd))
    return [e.content for e in events if isinstance(e, MessageEvent)][:ended]


def test_a_spawned_model_and_its_options_are_recorded_and_resumed_elsewhere(
    backend: Backend, db: str, noted: Noted
) -> None:
    """Issue 13 point 7: a new runtime resumes a top-level agent without being given
    its model; persona, provider and tool filter come back too. The record is
    log-only: a turn's history does not show it."""
    options = AgentOptions(persona="terse", tool_filter=("search",), provider="local")
    with Runtime(db, backend=backend) as rt:
        noted.register(rt, "a")
        agent = rt.spawn("note", options=options, label="top")
        sid = agent.session_id
        agent.followup("one")
        assert agent.wait_idle(10)
        assert isinstance(rt.store.read(sid)[0].event, AgentOptionsEvent)  # type: ignore[union-attr]
    with Runtime(db, backend=backend) as rt:
        noted.register(rt, "b")
        histories: list[tuple[str, ...]] = []

        def spy(_options: object) -> object:
            def on_turn(turn: object) -> object:
                histories.append(tuple(e.type for e in turn.history))  # type: ignore[attr-defined]
                return None

            return on_turn

        rt.models.register("note", spy, replace=True)
        again = rt.agents.resume(sid)
        assert again.options.model == "note"
        assert again.options.persona == "terse"
        assert again.options.tool_filter == ("search",)
        assert again.options.provider == "local"
        again.followup("two")
        assert again.wait_idle(10)
        assert histories and "agent/options" not in histories[0]
        assert "message" in histories[0]


def test_resume_without_a_recorded_model_is_a_typed_error(backend: Backend, db: str) -> None:
    """Issue 13 point 7: a callable behaviour cannot be recorded (``MODEL_NOT_FOUND``
    without ``behaviour=``), nor can a model the new runtime does not register."""
    with Runtime(db, backend=backend) as rt:
        rt.models.register("private", lambda _o: lambda t: None)
        bare = rt.spawn(lambda turn: None).session_id
        named = rt.spawn("private").session_id
    with Runtime(db, backend=backend) as rt:
        for sid in (bare, named):
            with pytest.raises(SubagentError) as err:
                rt.agents.resume(sid)
            assert err.value.code == ErrorCode.MODEL_NOT_FOUND
            assert rt.agents.get(sid) is None
        assert rt.agents.resume(bare, behaviour=lambda turn: None).session_id == bare


def test_roots_lists_top_level_sessions_of_the_store_and_not_children(
    runtimes: list[Runtime],
) -> None:
    """Issue 13 point 7: ``agents.roots()`` -- every top-level session any runtime on
    the store created, oldest first; a subagent's session is not a root."""
    a, b = runtimes
    first = a.spawn("note", label="first")
    second = b.spawn("note", label="second")
    a.subagents.start_continuable(
        ContinuableStartSpec(parent=first, prompt="hi", label="kid", model="echo", provider="local")
    )
    for rt in runtimes:
        roots = rt.agents.roots()
        assert [h.id for h in roots] == [first.session_id, second.session_id]
        assert all(h.parent_session is None for h in roots)


def test_roots_on_a_memory_runtime_lists_the_live_ones(backend: Backend) -> None:
    """Issue 13 point 7: without a store, the live top-level agents are the roots."""
    with Runtime(backend=backend) as rt:
        agents = [rt.spawn("echo", label=str(i)) for i in range(3)]
        assert [h.id for h in rt.agents.roots()] == [a.session_id for a in agents]


def test_send_to_a_session_live_here_is_its_followup(runtimes: list[Runtime], noted: Noted) -> None:
    """Issue 13 point 7: ``send`` to a live session queues one turn, idempotently."""
    a, _ = runtimes
    agent = a.spawn("note")
    mid = a.agents.send(agent.session_id, "x", message_id=M1)
    assert mid == MessageId(M1)
    assert a.agents.send(agent.session_id, "x", message_id=M1) == mid
    assert agent.wait_idle(10)
    assert noted.items() == [("a", "x", False)]


def test_send_to_a_stored_session_resumes_it_here_and_runs_once(
    backend: Backend, db: str, noted: Noted
) -> None:
    """Issue 13 point 7: the restarted server's case -- a session nobody holds is
    resumed by ``send`` and runs the message; the same id again, even after
    another restart, queues nothing."""
    with Runtime(db, backend=backend) as rt:
        noted.register(rt, "a")
        sid = rt.spawn("note").session_id
    with Runtime(db, backend=backend) as rt:
        noted.register(rt, "b")
        rt.agents.send(sid, "after restart", message_id=SAME)
        agent = rt.agents.get(sid)
        assert agent is not None
        assert agent.wait_idle(10)
    with Runtime(db, backend=backend) as rt:
        noted.register(rt, "c")
        assert rt.agents.send(sid, "after restart", message_id=SAME) == MessageId(SAME)
        assert rt.agents.get(sid) is None
        assert _ran(rt, sid) == ["after restart"]
    assert noted.items() == [("b", "after restart", False)]


def test_send_to_a_session_another_runtime_holds_runs_there(
    runtimes: list[Runtime], noted: Noted
) -> None:
    """Issue 13 points 4 and 7: ``send`` in a runtime that does not hold the lease
    commits the message and wakes the holder, which runs it (in order, once);
    the sender never activates the session. Repeated, with interleaved local
    follow-ups, to catch a lost or doubled pickup."""
    a, b = runtimes
    agent = a.spawn("note")
    sid = agent.session_id
    expected = []
    for i in range(20):
        b.agents.send(sid, f"remote {i}")
        agent.followup(f"local {i}")
        expected += [f"remote {i}", f"local {i}"]
        assert b.agents.get(sid) is None
    assert noted.wait_for(lambda items: len(items) >= len(expected))
    assert agent.wait_idle(10)
    ran = noted.items()
    assert {who for who, _, _ in ran} == {"a"}
    assert sorted(c for _, c, _ in ran) == sorted(expected)
    # Each producer's own messages run in the order it sent them.
    for prefix in ("remote", "local"):
        mine = [c for _, c, _ in ran if c.startswith(prefix)]
        assert mine == [c for c in expected if c.startswith(prefix)]


def test_send_refuses_what_it_must_and_accepts_nothing(runtimes: list[Runtime], db: str) -> None:
    """Issue 13 points 7 and 8: an unknown session, a subagent's session, a session
    that cannot be resumed here -- each a typed error, and nothing stays accepted."""
    a, b = runtimes
    root = a.spawn("note")
    kid = a.subagents.start_continuable(
        ContinuableStartSpec(parent=root, prompt="hi", label="kid", model="echo", provider="local")
    ).child_id
    with pytest.raises(SubagentError) as err:
        b.agents.send("0" * 32, "x")
    assert err.value.code == ErrorCode.SESSION_NOT_FOUND
    with pytest.raises(SubagentError) as err:
        b.agents.send(kid, "x")
    assert err.value.code == ErrorCode.UNAUTHORIZED
    a.models.register("only-in-a", lambda _o: lambda t: None)
    orphan = a.spawn("only-in-a")
    orphan.dispose()
    a.sessions.flush()  # its lease is released with its last write: nobody holds it now
    with pytest.raises(SubagentError) as err:
        b.agents.send(orphan.session_id, "x")
    assert err.value.code == ErrorCode.MODEL_NOT_FOUND
    assert _pending(db, orphan.session_id) == []
    with pytest.raises(SubagentError) as err:
        b.agents.send(root.session_id, object())
    assert err.value.code == ErrorCode.ENCODE_ERROR
    with pytest.raises(SubagentError) as err:
        b.agents.send(root.session_id, "x", source="me")  # type: ignore[arg-type]
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert _pending(db, root.session_id) == []


def test_a_subagent_is_neither_resumed_nor_sent_to_directly(
    runtimes: list[Runtime], backend: Backend
) -> None:
    """Issue 13 point 7, R-FUP-1: ``agents.resume`` and ``agents.send`` refuse a
    subagent's session with ``UNAUTHORIZED`` whether the child is resident,
    settled, or a one-shot that ended -- the same answer whatever its residency.
    A resumed continuable child would be an Agent outside the continuation
    manager: its parent could no longer reach it, and whoever held the handle
    could give it turns. The parent's follow-up still reaches it afterwards."""
    a, _ = runtimes
    held = Gate("held")

    def child(turn: Any) -> Any:
        if turn.content == "hold":
            held.pass_through(turn.signal)
        return turn.content

    a.models.register("child", lambda _o: child)
    root = a.spawn("note")
    probe = LifecycleProbe(a)
    kid = a.subagents.start_continuable(
        ContinuableStartSpec(
            parent=root, prompt="hold", label="kid", model="child", provider="local"
        )
    ).child_id
    assert held.wait_reached(10)
    for call in (lambda: a.agents.send(kid, "x"), lambda: a.agents.resume(kid)):
        with pytest.raises(SubagentError) as err:
            call()
        assert err.value.code == ErrorCode.UNAUTHORIZED  # resident
    held.release()
    assert probe.wait_for(lambda events: [e.type for e in events][-1:] == ["subagent/end"])
    assert a.agents.get(kid) is None
    for call in (lambda: a.agents.send(kid, "x"), lambda: a.agents.resume(kid)):
        with pytest.raises(SubagentError) as err:
            call()
        assert err.value.code == ErrorCode.UNAUTHORIZED  # settled
    assert a.agents.get(kid) is None
    a.subagents.followup(root, kid, "again")
    assert wait_quiescent(a, 10)
    a.sessions.flush()
    ran = [r.event.output for r in a.sessions.read(kid) if isinstance(r.event, TurnEnd)]
    assert ran == ["hold", "again"]
    run = a.subagents.start(
        "local", SubagentStartRequest(parent=root, prompt="once", signal=AbortSignal.never())
    )
    run.result.get(10)
    run.dispose()
    with pytest.raises(SubagentError) as err:
        a.agents.resume(run.id)
    assert err.value.code == ErrorCode.UNAUTHORIZED  # a one-shot that ended


def test_resume_and_send_race_a_child_settling_and_always_refuse(runtimes: list[Runtime]) -> None:
    """The race of the test above: each follow-up wakes the child, which runs one
    turn and settles while ``resume`` and ``send`` are called at it -- whatever
    state each call meets (resident, settling, settled), the answer is
    ``UNAUTHORIZED`` (never ``SESSION_EXISTS`` or ``AGENT_DISPOSED``), and every
    follow-up of the parent runs exactly once."""
    a, _ = runtimes
    root = a.spawn("note")
    kid = a.subagents.start_continuable(
        ContinuableStartSpec(parent=root, prompt=0, label="kid", model="echo", provider="local")
    ).child_id
    sent = [a.subagents.followup(root, kid, i) for i in range(1, 60)]
    codes = set()
    for i in range(60, 120):
        sent.append(a.subagents.followup(root, kid, i))
        for call in (a.agents.resume, lambda sid: a.agents.send(sid, "x")):
            with pytest.raises(SubagentError) as err:
                call(kid)
            codes.add(err.value.code)
    assert codes == {ErrorCode.UNAUTHORIZED}
    assert wait_quiescent(a, 30)
    a.sessions.flush()
    ran = [r.event.output for r in a.sessions.read(kid) if isinstance(r.event, TurnEnd)]
    assert ran == list(range(120))


@pytest.mark.parametrize("adopt", [True, False])
def test_a_runtime_that_adopts_nothing_leaves_sessions_nobody_holds(
    backend: Backend, db: str, adopt: bool
) -> None:
    """``Runtime(adopt=False)`` -- what a placement host runs -- does not activate a
    session nobody holds when its mail pickup finds work waiting for it (a Ray
    host's sweep took a user's root over once the user's runtime had closed);
    the default runtime activates it and runs what waits."""
    from subagents.protocol import new_message_id, trusted_message

    with Runtime(db, backend=backend) as first:
        sid = first.spawn("echo", label="root").session_id
    store = open_store(db)
    assert store is not None
    try:
        store.accept(sid, [trusted_message(new_message_id(), "waiting", None)])
    finally:
        store.close()
    with Runtime(db, backend=backend, adopt=adopt) as rt:
        assert rt.mail is not None and rt.store is not None
        rt.mail.pickup(sid)
        if adopt:
            agent = rt.agents.get(sid)
            assert agent is not None and agent.wait_idle(10)
            assert [e.output for e in rt.sessions.turn_ends(sid)] == ["waiting"]
        else:
            assert rt.agents.get(sid) is None
            assert [e.event.content for e in rt.store.pending(sid)] == ["waiting"]
    with pytest.raises(SubagentError) as caught:
        Runtime(db, backend=backend, adopt=1)
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT
