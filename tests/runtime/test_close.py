"""``Runtime.close``: the agents of one delegation depth stop together.

R-RES-6 (children strictly before parents) is tested with a three-level chain in
tests/continuable/test_continuable_residency.py; here, that siblings are not
disposed one after another: each waits, inside its own disposal, for the other's
to have reached the same point, which one-by-one disposal can never satisfy (the
first would wait for a disposal that starts only after it ends).
"""

from __future__ import annotations

from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import ErrorCode, SubagentError
from subagents.store import MemoryStore

pytestmark = pytest.mark.timeout(60)


def _close_two_that_meet(backend: Backend) -> tuple[list[str], list[BaseException]]:
    """Close a runtime of two top-level agents whose disposals each wait for the
    other's; returns who got through, and the waits that timed out."""
    rt = Runtime(MemoryStore(), backend=backend)
    agents = [rt.spawn("echo", label=name) for name in ("a", "b")]
    gates = {name: Gate(name) for name in ("a", "b")}
    passed: list[str] = []
    failed: list[BaseException] = []

    def meet(agent: Any) -> None:
        me, other = agent.label, "b" if agent.label == "a" else "a"
        gates[me].release()
        try:
            gates[other].pass_through(timeout=10)
        except SubagentError as exc:
            failed.append(exc)
            return
        passed.append(me)

    for agent in agents:
        agent.add_dispose_listener(meet)
    rt.close()
    assert all(agent.disposed_now() for agent in agents)
    return passed, failed


def test_close_disposes_the_agents_of_one_depth_together(backend: Backend) -> None:
    """Each of two top-level agents, in its disposal (a dispose listener runs in the
    actor's stop), passes its own gate and waits for the other's: both get through,
    and nothing is left disposing. Twenty runtimes, so the order the two are taken
    in varies."""
    for _ in range(20):
        passed, failed = _close_two_that_meet(backend)
        assert failed == [] and sorted(passed) == ["a", "b"]


def test_close_disposes_children_before_parents_with_siblings_together(backend: Backend) -> None:
    """R-RES-6: a parent's disposal starts only after every child's has ended, though
    the children of one depth stop together (ten resident continuable children)."""
    rt = Runtime(MemoryStore(), backend=backend, keep_warm=float("inf"))
    parent = rt.spawn("echo", label="parent")
    for i in range(10):
        spec = ContinuableStartSpec(parent=parent, provider="local", prompt="p", label=f"k{i}")
        rt.subagents.start_continuable(spec)
    assert rt.wait_idle(30)
    agents = rt.agents.list()
    kids = [f"k{i}" for i in range(10)]
    assert sorted(a.label or "" for a in agents) == sorted(["parent", *kids])
    order: list[str] = []
    for agent in agents:
        agent.add_dispose_listener(lambda a: order.append(a.label))
    rt.close()
    assert sorted(order[:10]) == kids
    assert order[10:] == ["parent"]


def test_close_from_a_turn_refuses_and_changes_nothing(backend: Backend) -> None:
    """``close()`` called from one of the runtime's own turns would wait for that
    turn (on threads it hung for a minute): it raises ``WRONG_THREAD`` at once,
    the turn goes on, and a close from outside then works as usual."""
    rt = Runtime(MemoryStore(), backend=backend)
    caught: list[Any] = []

    def closer(turn: Any) -> Any:
        try:
            rt.close()
        except SubagentError as exc:
            caught.append(exc.code)
        return "still here"

    agent = rt.spawn(closer)
    agent.followup("close, please")
    assert agent.wait_idle(10)
    assert caught == [ErrorCode.WRONG_THREAD]
    (end,) = rt.sessions.turn_ends(agent.session_id)
    assert (end.stop_reason, end.output) == ("completed", "still here")
    rt.close()
    assert agent.disposed_now()


@pytest.mark.parametrize("steer", [False, True])
def test_a_followup_its_store_closed_under_stays_accepted(
    rt_sqlite: Runtime, monkeypatch: pytest.MonkeyPatch, steer: bool
) -> None:
    """A follow-up committed, then refused by an agent the closing runtime disposes,
    whose take-back finds the store closed: the message stays in the durable inbox
    (it runs at the next activation), so the call returns its id -- it raised the
    store's ``STORE_CLOSED``, for a message that was accepted after all. A take-back
    that works still raises the refusal, and leaves nothing."""
    agent = rt_sqlite.spawn("echo")
    store = rt_sqlite.sessions.persistence
    assert store is not None

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise SubagentError("disposed", code=ErrorCode.AGENT_DISPOSED)

    monkeypatch.setattr(agent, "deliver", refuse)
    with pytest.raises(SubagentError) as caught:
        agent.followup("refused", steer=steer)
    assert caught.value.code == ErrorCode.AGENT_DISPOSED
    assert store.pending(agent.session_id) == []

    def store_closed(*_a: Any, **_k: Any) -> Any:
        raise SubagentError("closed", code=ErrorCode.STORE_CLOSED)

    monkeypatch.setattr(rt_sqlite.sessions, "retract", store_closed)
    answer = agent.followup("kept", steer=steer)
    mid = answer.message_id if steer else answer
    if steer:
        assert answer.outcome == "queued"
    assert [e.message_id for e in store.pending(agent.session_id)] == [mid]


def test_a_strict_steer_whose_take_back_fails_is_queued_and_runs(
    rt_sqlite: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A strict steer that found no open turn, whose take-back then failed otherwise
    (a busy timeout), stays in the durable inbox: accepted, it is no steer any more
    but a follow-up, so the call says ``queued`` and the agent runs it now, once --
    it raised the timeout while the message stayed, to run at the next activation
    (and, before that, it was reported ``queued`` and left unrun)."""
    agent = rt_sqlite.spawn("echo")
    store = rt_sqlite.sessions.persistence
    assert store is not None

    def busy(*_a: Any, **_k: Any) -> Any:
        raise SubagentError("database is locked", code=ErrorCode.TIMEOUT)

    monkeypatch.setattr(rt_sqlite.sessions, "retract", busy)
    answer = agent.followup("now or never", steer="strict")
    assert answer.outcome == "queued"
    assert agent.wait_idle(10)
    monkeypatch.undo()
    rt_sqlite.sessions.flush()
    (end,) = rt_sqlite.sessions.turn_ends(agent.session_id)
    assert end.stop_reason == "completed"
    assert store.pending(agent.session_id) == []


@pytest.mark.parametrize("store", ["none", "memory"])
def test_a_closed_runtime_says_it_is_closed_not_that_its_sessions_never_were(
    backend: Backend, store: str
) -> None:
    """R-ERR-1: reading a session (or sending to it) after ``close()`` -- the
    common slip of reading results after the ``with Runtime()`` block -- raises
    ``STORE_CLOSED`` with or without a store. Without one it was
    ``SESSION_NOT_FOUND`` "no session ...": as if the agent had never run."""
    rt = Runtime(MemoryStore() if store == "memory" else None, backend=backend)
    with rt:
        agent = rt.spawn("echo")
        agent.followup("hello")
        assert agent.wait_idle(10)
        assert rt.sessions.turn_ends(agent.session_id)[-1].output == "hello"
    sid = agent.session_id
    calls = {
        "read": lambda: rt.sessions.read(sid),
        "turn_ends": lambda: rt.sessions.turn_ends(sid),
        "header": lambda: rt.sessions.header(sid),
        "roots": lambda: rt.agents.roots(),
        "send": lambda: rt.agents.send(sid, "again"),
        "followup by id": lambda: rt.subagents.followup(sid, "0" * 31 + "1", "again"),
    }
    codes = {}
    for name, call in calls.items():
        with pytest.raises(SubagentError) as info:
            call()
        codes[name] = info.value.code
    assert codes == dict.fromkeys(calls, ErrorCode.STORE_CLOSED)
