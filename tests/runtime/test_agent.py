"""The Agent actor: FIFO turns, session records, cancel, quiescence, failures."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors.testing import Block, Call, Fail, Gate, Reply, ScriptedBehaviour
from subagents.protocol import (
    AgentOptionsEvent,
    ErrorCode,
    MessageEvent,
    SubagentError,
    TurnEnd,
    TurnStart,
    new_message_id,
)


def _turn_ends(rt: Runtime, agent) -> list[TurnEnd]:
    return [r.event for r in rt.sessions.read(agent.session_id) if isinstance(r.event, TurnEnd)]


def test_each_followup_is_one_fifo_turn(rt: Runtime) -> None:
    """R-FUP-5: each accepted follow-up becomes exactly one turn, in acceptance order."""
    agent = rt.spawn("echo")
    ids = [agent.followup(f"m{i}") for i in range(50)]
    assert agent.wait_idle(10)
    events = [r.event for r in rt.sessions.read(agent.session_id)]
    assert isinstance(events.pop(0), AgentOptionsEvent)  # the spawn's recorded model
    messages = [e for e in events if isinstance(e, MessageEvent)]
    assert [m.message_id for m in messages] == ids
    ends = [e for e in events if isinstance(e, TurnEnd)]
    assert [e.output for e in ends] == [f"m{i}" for i in range(50)]
    assert all(e.stop_reason == "completed" for e in ends)
    # Every turn is turn/start, message, turn/end in that order.
    types = [type(e) for e in events]
    assert types == [TurnStart, MessageEvent, TurnEnd] * 50


def test_message_accepted_during_open_turn_is_not_visible_in_it(rt: Runtime) -> None:
    """R-FUP-5: a message accepted during an open turn runs as the next turn only."""
    gate = Gate()
    seen: list[tuple[int, tuple]] = []

    def behaviour(turn):
        seen.append((turn.index, tuple(m.content for m in turn.messages)))
        if turn.index == 0:
            gate.pass_through(turn.signal)
        return turn.content

    agent = rt.spawn(behaviour)
    agent.followup("first")
    assert gate.wait_reached(10)
    agent.followup("second")
    gate.release()
    assert agent.wait_idle(10)
    assert seen == [(0, ("first",)), (1, ("second",))]


def test_cancel_keep_inbox_runs_queued_later_and_does_not_requeue(rt: Runtime) -> None:
    """R-INT-8, R-INT-9, R-INT-10 (agent level): cancel aborts the running turn;
    queued messages still run in order; the interrupted message never runs again."""
    gate = Gate()
    rt.models.register("w", lambda _o: ScriptedBehaviour(per_turn=[[Block(gate)]]))
    agent = rt.spawn("w")
    agent.followup("a")
    assert gate.wait_reached(10)
    agent.followup("b")
    agent.followup("c")
    agent.cancel("stop", keep_inbox=True)
    assert agent.wait_idle(10)
    ends = _turn_ends(rt, agent)
    assert [(e.turn, e.stop_reason, e.output) for e in ends] == [
        (0, "cancelled", None),
        (1, "completed", "b"),
        (2, "completed", "c"),
    ]
    contents = [
        r.event.content
        for r in rt.sessions.read(agent.session_id)
        if isinstance(r.event, MessageEvent)
    ]
    assert contents == ["a", "b", "c"]


def test_cancel_without_inbox_discards_queued(rt: Runtime) -> None:
    """cancel(keep_inbox=False) skips every message accepted before it: the
    behaviour never sees one, and the log keeps each as a turn that ended
    cancelled unrun (every accepted id stays in the log)."""
    gate = Gate()
    seen: list[Any] = []
    scripted = ScriptedBehaviour(per_turn=[[Block(gate)]])

    def behaviour(turn: Any) -> Any:
        seen.append(turn.content)
        return scripted.on_turn(turn)

    rt.models.register("w", lambda _o: behaviour)
    agent = rt.spawn("w")
    agent.followup("a")
    assert gate.wait_reached(10)
    agent.followup("b")
    agent.cancel("stop", keep_inbox=False)
    assert agent.wait_idle(10)
    agent.followup("after")
    assert agent.wait_idle(10)
    ends = _turn_ends(rt, agent)
    assert [(e.stop_reason, e.output, e.error) for e in ends] == [
        ("cancelled", None, None),
        ("cancelled", None, "discarded unrun"),
        ("completed", "after", None),
    ]
    assert seen == ["a", "after"]


def test_cancel_race_many_times(rt: Runtime) -> None:
    """R-INT-9/R-INT-10 race: cancelling while messages stream in never loses or
    repeats a message; every accepted message has exactly one turn."""
    for round_ in range(30):
        gate = Gate()
        rt.models.register(
            f"w{round_}", lambda _o, g=gate: ScriptedBehaviour(per_turn=[[Block(g)]])
        )
        agent = rt.spawn(f"w{round_}")
        ids = [agent.followup(i) for i in range(5)]
        assert gate.wait_reached(10)
        ids += [agent.followup(i) for i in range(5, 10)]
        agent.cancel("x")
        ids += [agent.followup(i) for i in range(10, 15)]
        assert agent.wait_idle(10)
        starts = [
            r.event for r in rt.sessions.read(agent.session_id) if isinstance(r.event, TurnStart)
        ]
        claimed = [m for s in starts for m in s.message_ids]
        assert claimed == ids
        agent.dispose()


def test_failing_behaviour_ends_turn_failed_and_agent_keeps_serving(rt: Runtime, caplog) -> None:
    """A raising behaviour ends its turn 'failed', is recorded and logged, and the
    agent serves later turns."""
    rt.models.register("f", lambda _o: ScriptedBehaviour(per_turn=[[Fail("boom")]]))
    agent = rt.spawn("f")
    with caplog.at_level(logging.ERROR, logger="subagents"):
        agent.followup("x")
        agent.followup("y")
        assert agent.wait_idle(10)
    ends = _turn_ends(rt, agent)
    assert ends[0].stop_reason == "failed" and "boom" in (ends[0].error or "")
    assert (ends[1].stop_reason, ends[1].output) == ("completed", "y")
    assert any(
        "boom" in r.getMessage() or (r.exc_info and "boom" in str(r.exc_info[1]))
        for r in caplog.records
    )


def test_wait_idle_times_out_while_blocked(rt: Runtime) -> None:
    """Quiescence is observable: wait_idle is False while a turn is open."""
    gate = Gate()
    agent = rt.spawn(lambda t: gate.pass_through(t.signal))
    agent.followup("x")
    assert gate.wait_reached(10)
    assert not agent.idle
    assert agent.wait_idle(0.05) is False
    gate.release()
    assert agent.wait_idle(10) and agent.idle


def test_followup_after_dispose_raises(rt: Runtime) -> None:
    """A disposed agent refuses follow-ups with AGENT_DISPOSED; dispose is idempotent."""
    agent = rt.spawn("echo")
    agent.dispose()
    agent.dispose()
    with pytest.raises(SubagentError) as err:
        agent.followup("x")
    assert err.value.code == ErrorCode.AGENT_DISPOSED
    assert rt.agents.get(agent.session_id) is None


def test_unrepresentable_content_is_refused_before_acceptance(rt: Runtime) -> None:
    """Content the log cannot hold is refused at followup with ENCODE_ERROR; nothing accepted."""
    agent = rt.spawn("echo")
    with pytest.raises(SubagentError) as err:
        agent.followup({1, 2})
    assert err.value.code == ErrorCode.ENCODE_ERROR
    assert agent.idle
    assert [type(r.event) for r in rt.sessions.read(agent.session_id)] == [AgentOptionsEvent]


def test_unrepresentable_output_fails_the_turn(rt: Runtime) -> None:
    agent = rt.spawn(lambda t: object())
    agent.followup("x")
    assert agent.wait_idle(10)
    (end,) = _turn_ends(rt, agent)
    assert end.stop_reason == "failed"


def test_dispose_from_own_turn_does_not_deadlock(rt: Runtime) -> None:
    done = Gate()

    def behaviour(turn):
        turn.agent.dispose()
        done.release()
        return "bye"

    agent = rt.spawn(behaviour)
    agent.followup("x")
    assert done.released or done._released.signal.wait(10)
    assert agent.wait_disposed(10)


def test_a_dispose_that_outwaits_its_timeout_says_so(rt: Runtime) -> None:
    """A turn that does not end at its cancellation: ``dispose(timeout=)`` raises a
    typed ``TIMEOUT`` (not pykka's), and the disposal completes when the turn ends."""
    gate = Gate()
    agent = rt.spawn(lambda turn: gate.pass_through(None))  # deaf to its signal
    agent.followup("x")
    assert gate.wait_reached(10)
    with pytest.raises(SubagentError) as err:
        agent.dispose(timeout=0.05)
    assert err.value.code == ErrorCode.TIMEOUT
    assert rt.agents.get(agent.session_id) is None  # gone from the registry already
    gate.release()
    assert agent.wait_disposed(10)
    agent.dispose(timeout=0.05)  # done: a second call returns at once


def test_history_excludes_current_turn(rt: Runtime) -> None:
    """turn.history holds the events before the turn."""
    seen = []
    agent = rt.spawn(Call(lambda t: seen.append(len(t.history))).run)
    for i in range(3):
        agent.followup(i)
    assert agent.wait_idle(10)
    assert seen == [0, 3, 6]


def test_reply_formats_content(rt: Runtime) -> None:
    rt.models.register("r", lambda _o: ScriptedBehaviour([Reply("got {content}")]))
    agent = rt.spawn("r")
    agent.followup("x")
    assert agent.wait_idle(10)
    assert _turn_ends(rt, agent)[0].output == "got x"


def _wait_into(agent: Any, results: list[bool]) -> None:
    results.append(agent.wait_idle(10))


def test_wait_idle_wakes_on_quiescence_not_on_a_turn_end(rt: Runtime) -> None:
    """Quiescence (nothing in flight), many rounds: waiters parked while turn 1
    is open stay parked when it ends with turn 2 queued, and all wake when turn 2
    ends; a waiter that timed out earlier does not spoil the next one's wait.
    Orders are forced with gates carried in the messages."""
    gates: dict[str, Gate] = {}
    agent = rt.spawn(lambda t: gates[t.content].pass_through(t.signal))
    backend = rt.backend
    for i in range(100):
        first = gates[f"first{i}"] = Gate("first")
        second = gates[f"second{i}"] = Gate("second")
        agent.followup(f"first{i}")
        assert first.wait_reached(10)
        assert agent.wait_idle(0) is False  # leaves a waiter behind, unset
        results: list[bool] = []
        waiters = [backend.spawn(_wait_into, agent, results) for _ in range(3)]
        agent.followup(f"second{i}")
        first.release()
        assert second.wait_reached(10)
        assert results == [] or not any(results)  # turn 1 ended; turn 2 still in flight
        assert not agent.idle
        second.release()
        for waiter in waiters:
            assert waiter.join(10)
        assert results == [True, True, True]
        assert agent.idle


def test_a_run_of_queued_turns_never_overtakes_another_message(rt: Runtime) -> None:
    """Issue 20 point 2 (no pass through pykka's loop per turn): the turns queued
    behind a turn run in one pass of the agent's loop, but never ahead of a message
    of another kind queued between them. A quiet report queued between two
    follow-ups is context of the second's turn, not the first's; a call queued
    between runs after the turns before it and before those after it; a
    Twenty rounds, on both backends."""
    seen: list[tuple[Any, ...]] = []
    gates: list[Gate] = []

    def behaviour(turn: Any) -> None:
        if turn.content == "hold":
            gates[-1].pass_through(turn.signal)
        seen.append(("turn", turn.content, tuple(m.content for m in turn.context)))

    agent = rt.spawn(behaviour)
    for _ in range(20):
        seen.clear()
        gates.append(Gate())
        agent.followup("hold")
        assert gates[-1].wait_reached(10)
        agent.followup("a")
        agent.inject_quiet("q", None, new_message_id())
        agent.followup("b")
        agent.call_in_loop(lambda: seen.append(("call",)))
        agent.followup("c")
        agent.followup("d")
        gates[-1].release()
        assert agent.wait_idle(10)
        assert seen == [
            ("turn", "hold", ()),
            ("turn", "a", ()),
            ("turn", "b", ("q",)),
            ("call",),
            ("turn", "c", ()),
            ("turn", "d", ()),
        ]
