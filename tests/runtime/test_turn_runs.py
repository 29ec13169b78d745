"""A run of queued turns (``_agents/_run.py``): the follow-ups waiting in an agent's
mailbox run in one pass, settled and (memory store) stored together -- and still
each its own turn, every one settled and stored before anyone sees the agent idle."""

from __future__ import annotations

from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._agents._run import RUN
from subagents.actors.testing import Gate
from subagents.protocol import ErrorCode, MessageEvent, SubagentError, TurnEnd, TurnStart
from subagents.store import MemoryStore

# More than two runs' worth: the run's cap is met, then its end.
N = 2 * RUN + 7


def _kinds(store: MemoryStore, sid: Any) -> list[type]:
    return [type(r.event) for r in store.read(sid)]


def _turn_kinds(store: MemoryStore, sid: Any) -> list[type]:
    return [k for k in _kinds(store, sid) if k in (TurnStart, MessageEvent, TurnEnd)]


def test_a_run_is_stored_and_settled_before_the_agent_is_idle(backend: str) -> None:
    """R-FUP-5, R-FUP-6: follow-ups queued behind a held turn each run as one turn,
    in order; once the agent is idle the store itself (not only the live log) holds
    every one of them, and nothing is counted in flight. Five rounds."""
    for _ in range(5):
        _one_run(backend)


def _one_run(backend: str) -> None:
    store = MemoryStore()
    gate = Gate()
    seen: list[Any] = []
    stored_at_start: list[int] = []
    with Runtime(store, backend=backend, durability="relaxed") as rt:

        def behaviour(turn: Any) -> Any:
            if turn.index == 0:
                gate.pass_through(turn.signal)
            else:
                # Inside the run: the store lags the live log by at most a run.
                stored_at_start.append(len(_turn_kinds(store, agent.session_id)))
            seen.append(turn.content)
            return None

        agent = rt.spawn(behaviour)
        agent.followup("first")
        assert gate.wait_reached(10)
        for i in range(N):
            agent.followup(i)
        gate.release()
        assert agent.wait_idle(30)
        assert seen == ["first", *range(N)]
        kinds = _turn_kinds(store, agent.session_id)
        assert kinds == [TurnStart, MessageEvent, TurnEnd] * (N + 1)
        assert agent.statistics().inbox == 0
        assert agent.idle
        for k, stored in enumerate(stored_at_start, start=1):
            assert 3 * (k - RUN) <= stored <= 3 * k, (k, stored)


def test_idle_listeners_hear_a_run_once_with_every_turn_stored(backend: str) -> None:
    """R-FUP-6: an idle listener runs when the run made the agent idle -- once for a
    run, not once a turn -- and by then the store holds all of the run's turns.
    (It runs in the actor once the agent is idle: ``wait_idle`` may return first.)"""
    store = MemoryStore()
    gate = Gate()
    heard: list[int] = []
    with Runtime(store, backend=backend, durability="relaxed") as rt:
        told = rt.backend.event()

        def listener(a: Any) -> None:
            heard.append(len(_turn_kinds(store, a.session_id)))
            told.set()

        def behaviour(turn: Any) -> Any:
            if turn.index == 0:
                gate.pass_through(turn.signal)
            return None

        agent = rt.spawn(behaviour)
        agent.followup("first")
        assert gate.wait_reached(10)
        agent.add_idle_listener(listener)
        for i in range(N):
            agent.followup(i)
        gate.release()
        assert agent.wait_idle(30)
        assert told.wait(30)  # the first call; a call a turn would have come before
        assert heard == [3 * (N + 1)]


def test_a_cancel_in_the_middle_of_a_run_drops_the_rest_and_settles(backend: str) -> None:
    """R-INT-8, R-INT-9: a cancel without ``keep_inbox`` while a run holds a turn
    skips the run's queued turns unrun; the turns the run ran before it are stored,
    the agent settles idle with nothing in flight, and the next follow-up runs.
    Repeated: the cancel lands at a different turn of the run each time."""
    for at in (1, 2, RUN - 1, RUN, RUN + 1, N - 1):
        _cancel_at(backend, at)


def _cancel_at(backend: str, at: int) -> None:
    store = MemoryStore()
    gates = [Gate(), Gate()]  # turn 0 waits at the first, turn ``at`` at the second
    ran: list[Any] = []
    with Runtime(store, backend=backend, durability="relaxed") as rt:

        def behaviour(turn: Any) -> Any:
            if turn.index in (0, at):
                gates[turn.index and 1].pass_through(turn.signal)
            ran.append(turn.content)
            return None

        agent = rt.spawn(behaviour)
        agent.followup("first")
        assert gates[0].wait_reached(10)
        for i in range(N):
            agent.followup(i)
        gates[0].release()
        assert gates[1].wait_reached(10)
        agent.cancel("enough", keep_inbox=False)
        gates[1].release()
        assert agent.wait_idle(30)
        assert ran == ["first", *range(at)], at
        assert agent.statistics().inbox == 0
        agent.followup("after")
        assert agent.wait_idle(30)
        assert ran[-1] == "after"
        ends = [r.event for r in store.read(agent.session_id) if type(r.event) is TurnEnd]
        # The cut turn and the N - at discarded (logged unrun) are cancelled.
        stops = ["completed"] * at + ["cancelled"] * (1 + N - at) + ["completed"]
        assert [e.stop_reason for e in ends] == stops


def test_a_bounded_inbox_has_room_for_every_turn_a_run_ended(backend: str) -> None:
    """R-FUP-6 with ``max_inbox``: a bounded child settles each turn of a run as it
    ends, so the bound counts only what waits or runs -- inside turn k of a run
    that began with the bound full, there is room for the k - 1 turns ended."""
    limit = 5
    gate = Gate()
    room: list[bool] = []
    ids: dict[str, Any] = {}
    with Runtime(MemoryStore(), backend=backend, durability="relaxed", max_inbox=limit) as rt:

        def behaviour(turn: Any) -> Any:
            if turn.index == 0:
                gate.pass_through(turn.signal)
            elif turn.index == limit - 1:  # turns 1 .. limit - 2 ended
                for _ in range(limit - 1):
                    try:
                        rt.subagents.followup(ids["root"], ids["child"], "more")
                        room.append(True)
                    except SubagentError as exc:
                        assert exc.code == ErrorCode.INBOX_FULL
                        room.append(False)
            return None

        rt.models.register("bounded", lambda _o: behaviour)
        root = ids["root"] = rt.spawn("echo")
        handle = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=root, provider="local", prompt="p", label="kid", model="bounded"
            )
        )
        ids["child"] = handle.child_id
        assert gate.wait_reached(10)
        for i in range(limit - 1):
            rt.subagents.followup(root, handle.child_id, i)
        with pytest.raises(SubagentError) as err:
            rt.subagents.followup(root, handle.child_id, "over")
        assert err.value.code == ErrorCode.INBOX_FULL
        gate.release()
        assert rt.wait_idle(30)
        # Turn limit-1 runs with itself and nothing behind it in flight: room for
        # limit - 1, of which the turns ended are limit - 2 ... all but one.
        assert room == [True] * (limit - 1)


@pytest.mark.parametrize("cut", [False, True])
def test_a_run_whose_store_write_fails_still_settles(
    backend: str, cut: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """R-FUP-6: the session service closes in the middle of a run (its store then
    refuses writes, ``STORE_CLOSED``): the run's turns all run, or (``cut``: a
    cancel without ``keep_inbox`` in the same turn) are discarded, and settle -- the
    agent goes idle -- and the failed write is logged, as a turn's own end is."""
    gate = Gate()
    ran: list[Any] = []
    with Runtime(MemoryStore(), backend=backend, durability="relaxed") as rt:

        def behaviour(turn: Any) -> Any:
            if turn.index == 0:
                gate.pass_through(turn.signal)
            elif turn.index == 3:
                rt.sessions.close()
                if cut:
                    agent.cancel("enough", keep_inbox=False)
            ran.append(turn.content)
            return None

        agent = rt.spawn(behaviour)
        agent.followup("first")
        assert gate.wait_reached(10)
        for i in range(10):
            agent.followup(i)
        gate.release()
        assert agent.wait_idle(10)
        assert ran == ["first", *range(3 if cut else 10)]
        assert agent.statistics().inbox == 0
    assert ("recording the last" if cut else "recording the end") in caplog.text
