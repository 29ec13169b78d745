"""A follow-up or steer refused after its commit, whose retraction does not take it
back, is accepted -- a top-level agent's own, and a parent's to its resident child.

Under strict durability a message is committed to its session's durable inbox,
taken by the live activation, before it is handed over. When the hand-over is
refused -- the agent's write failed as it took it, or a strict steer found no
open turn -- it is taken back and the refusal raised, unless it cannot be: the
store refuses the retraction (a trigger on ``DELETE FROM inbox``, a real SQLite
or PostgreSQL error), or a repeat of the same message id was accepted meanwhile
(its caller was told "accepted", or "duplicate"). Then it stays accepted: the call
returns its id -- a steer, which cannot steer it any more, says ``queued`` and
the agent queues it as a turn of its own now -- and it runs exactly once. A
non-strict steer that found no open turn whose retraction failed is queued from
the inbox row it committed (it was committed again as a "duplicate" and sat
unrun until the next activation). A follow-up given back by a retiring child and
routed keeps a repeat's acceptance the same way when the routing fails. Both
backends, both stores.
"""

from __future__ import annotations

from typing import Any

import pytest
from refusal_kit import Seen, refuse_retractions, resumed
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageId, SessionId, SubagentError

pytestmark = pytest.mark.timeout(90)

MID = MessageId("6" * 32)
KEEPS = ["store-error", "repeat"]


def _pending(rt: Runtime, session_id: SessionId) -> list[MessageId]:
    store = rt.sessions.persistence
    assert store is not None
    return [e.message_id for e in store.pending(session_id)]


def _next_activation(db: str, backend: Backend, seen: Seen, session_id: SessionId) -> None:
    """A top-level session's next activation, in a fresh runtime, given one more turn."""
    with Runtime(db, backend=backend) as rt:
        seen.register(rt, "next")
        resumed(rt, session_id).followup("next")
        assert seen.wait_for(lambda items: any(c == "next" for _, c, _ in items), 30)
        assert rt.wait_idle(30)


def _child_next_activation(
    db: str, backend: Backend, seen: Seen, parent_id: SessionId, child_id: SessionId
) -> None:
    """The child's next activation, in a fresh runtime: followed up by its parent."""
    with Runtime(db, backend=backend) as rt:
        seen.register(rt, "next")
        rt.subagents.followup(resumed(rt, parent_id), child_id, "then")
        assert seen.wait_for(lambda items: any(c == "then" for _, c, _ in items), 30)
        assert rt.wait_idle(30)


@pytest.mark.parametrize("keeps", KEEPS)
def test_a_followup_its_agent_refused_but_not_taken_back_is_accepted(
    backend: Backend, db: str, keeps: str
) -> None:
    """R-FUP-1, L-8: a top-level agent's ``followup`` is committed, then refused (the
    agent's write failed as it took it: ``PERSISTENCE_UNAVAILABLE``) and cannot be
    taken back -- the store refuses the retraction, or a repeat ``send`` of its id
    was accepted meanwhile (told its id). It stays in the inbox, so ``followup``
    returns its id (it raised the store's error, or the refusal, and deleted the
    message the repeat was told of), and it runs once, at the next activation."""
    seen = Seen()
    answers: list[MessageId] = []
    with Runtime(db, backend=backend) as rt:
        seen.register(rt, "first")
        agent = rt.spawn("note", label="top")
        sid = agent.session_id
        if keeps == "store-error":
            refuse_retractions(db, sid)
        real = agent.deliver

        def deliver(*args: Any, **kwargs: Any) -> Any:
            agent.deliver = real  # type: ignore[method-assign]
            code = ErrorCode.PERSISTENCE_UNAVAILABLE
            failure = SubagentError("injected write failure", code=code)
            rt.sessions._failed(sid, failure)  # the writer stops the agent, as it does
            try:
                return real(*args, **kwargs)
            finally:
                if keeps == "repeat":  # a retry of the same message, by another caller
                    answers.append(rt.agents.send(sid, "f1", message_id=MID))

        agent.deliver = deliver  # type: ignore[method-assign]
        assert agent.followup("f1", message_id=MID) == MID
        assert answers == ([MID] if keeps == "repeat" else [])
        assert MID in _pending(rt, sid)
    _next_activation(db, backend, seen, sid)
    assert seen.contents().count("f1") == 1


@pytest.mark.parametrize("keeps", KEEPS)
def test_a_strict_steer_not_taken_back_is_queued(backend: Backend, db: str, keeps: str) -> None:
    """R-FUP-1, L-5, S-2: a strict steer to an idle top-level agent finds no open turn
    and cannot be taken back -- the store refuses the retraction, or a repeat of its
    id was accepted meanwhile (told ``duplicate``). It is no steer any more but an
    accepted message: the call answers ``queued`` (it raised, the message staying
    in the inbox, or deleted what the repeat was told of) and the agent runs it now,
    once -- not again at its next activation."""
    seen = Seen()
    answers: list[Any] = []
    with Runtime(db, backend=backend) as rt:
        seen.register(rt, "first")
        agent = rt.spawn("note", label="top")
        sid = agent.session_id
        if keeps == "store-error":
            refuse_retractions(db, sid)
        real = agent.steer_in

        def steer_in(*args: Any, **kwargs: Any) -> Any:
            agent.steer_in = real  # type: ignore[method-assign]
            if keeps == "repeat":  # a retry of the same steer, by another caller
                answers.append(agent.followup("s1", message_id=MID, steer="strict"))
            return real(*args, **kwargs)

        agent.steer_in = steer_in  # type: ignore[method-assign]
        answer = agent.followup("s1", message_id=MID, steer="strict")
        assert tuple(answer) == (MID, "queued")
        assert [tuple(a) for a in answers] == ([(MID, "duplicate")] if keeps == "repeat" else [])
        assert seen.wait_for(lambda items: any(c == "s1" for _, c, _ in items), 30)
        assert rt.wait_idle(30)
    _next_activation(db, backend, seen, sid)
    assert seen.contents().count("s1") == 1


def _resident_child(rt: Runtime, seen: Seen) -> tuple[Any, SessionId, Any]:
    """A parent, and its continuable child that ran its prompt and stays resident
    (kept warm): ``(parent, child_id, child agent)``."""
    parent = rt.spawn("note", label="parent")
    child_id = rt.subagents.start_continuable(
        ContinuableStartSpec(
            parent=parent, provider="local", prompt="hi", label="kid", model="note"
        )
    ).child_id
    assert seen.wait_for(lambda items: any(c == "hi" for _, c, _ in items))
    assert rt.wait_idle(10)
    child = rt.agents.get(child_id)
    assert child is not None  # resident: kept warm
    return parent, SessionId(child_id), child


@pytest.mark.parametrize("keeps", KEEPS)
def test_a_strict_steer_to_a_resident_child_not_taken_back_is_queued(
    backend: Backend, db: str, keeps: str
) -> None:
    """R-FUP-1, R-FUP-5, L-5, S-2: a parent's strict steer to its idle resident child
    finds no open turn and cannot be taken back -- the store refuses the
    retraction, or a repeat of its id was accepted meanwhile (told ``duplicate``).
    The call answers ``queued`` (it raised ``TURN_NOT_OPEN`` while the message
    stayed in the inbox, or deleted what the repeat was told of) and the child runs
    it now, once -- not again at its next activation."""
    seen = Seen()
    answers: list[Any] = []
    with Runtime(db, backend=backend, keep_warm=60) as rt:
        seen.register(rt, "first")
        parent, child_id, child = _resident_child(rt, seen)
        if keeps == "store-error":
            refuse_retractions(db, child_id)
        real = child.steer_in

        def steer_in(*args: Any, **kwargs: Any) -> Any:
            child.steer_in = real
            if keeps == "repeat":  # a retry of the same steer, by another caller
                answers.append(
                    rt.subagents.followup(parent, child_id, "s1", message_id=MID, steer="strict")
                )
            return real(*args, **kwargs)

        child.steer_in = steer_in
        answer = rt.subagents.followup(parent, child_id, "s1", message_id=MID, steer="strict")
        assert tuple(answer) == (MID, "queued")
        assert [tuple(a) for a in answers] == ([(MID, "duplicate")] if keeps == "repeat" else [])
        assert seen.wait_for(lambda items: any(c == "s1" for _, c, _ in items), 30)
        assert rt.wait_idle(30)
        parent_id = parent.session_id
    _child_next_activation(db, backend, seen, parent_id, child_id)
    assert seen.contents().count("s1") == 1


def test_a_steer_whose_retraction_fails_is_queued_from_its_commit(
    backend: Backend, db: str
) -> None:
    """R-FUP-1, R-FUP-5, L-5: a parent's steer (``steer=True``) to its idle resident
    child finds no open turn, and the store refuses to take its commit back before
    it falls back to a queued follow-up. That follow-up is the message already
    committed: the call answers ``queued`` and the child runs it now, once. (It
    was committed again, found a "duplicate" -- the call said so -- and sat taken by
    the live activation, unrun until the child's next activation.)"""
    seen = Seen()
    with Runtime(db, backend=backend, keep_warm=60) as rt:
        seen.register(rt, "first")
        parent, child_id, _child = _resident_child(rt, seen)
        refuse_retractions(db, child_id)
        answer = rt.subagents.followup(parent, child_id, "s2", message_id=MID, steer=True)
        assert tuple(answer) == (MID, "queued")
        assert seen.wait_for(lambda items: any(c == "s2" for _, c, _ in items), 30)
        assert rt.wait_idle(30)
        parent_id = parent.session_id
    _child_next_activation(db, backend, seen, parent_id, child_id)
    assert seen.contents().count("s2") == 1


def test_a_routed_followup_keeps_a_repeat_accepted_since(backend: Backend, db: str) -> None:
    """R-FUP-1, R-FUP-5, L-8: a follow-up committed for a resident child that turns
    out to be retiring is given back and routed through the registry; a repeat of
    its id is accepted meanwhile (told its id), and the routing then fails
    (``CANCELLED``). The take-back leaves the message the repeat answered for: the
    call returns its id too (it deleted it and raised), and the child runs it once."""
    seen = Seen()
    answers: list[Any] = []
    with Runtime(db, backend=backend, keep_warm=60) as rt:
        seen.register(rt, "first")
        parent, child_id, child = _resident_child(rt, seen)
        real = child.admit_followup

        def retiring(*_args: Any, **_kwargs: Any) -> bool:
            child.admit_followup = real
            answers.append(rt.subagents.followup(parent, child_id, "f9", message_id=MID))
            return False  # the child closed its gate: the follow-up is routed

        def cancelled(*_args: Any, **_kwargs: Any) -> Any:
            raise SubagentError("cancelled", code=ErrorCode.CANCELLED)

        child.admit_followup = retiring
        materializer = rt.subagents._continuation._materializer
        materializer.route = cancelled  # type: ignore[method-assign]
        assert rt.subagents.followup(parent, child_id, "f9", message_id=MID) == MID
        assert answers == [MID]
        del materializer.route
        parent_id = parent.session_id
    _child_next_activation(db, backend, seen, parent_id, child_id)
    assert seen.contents().count("f9") == 1
