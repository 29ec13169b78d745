"""Steering, opt-in (issue 16 point 4; the older design's S-1/S-2, the seed's L-5).

``followup(..., steer=True)`` hands a message to the recipient's open turn, which
sees it at its next safe point (``turn.steering()``), recorded in the log inside
that turn; with no open turn it is queued as a turn of its own. ``steer="strict"``
refuses instead (``TURN_NOT_OPEN``), delivering nothing and never resuming a cold
child. Run on both backends, on memory, and on SQLite under both durabilities.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Block, Call, Gate, Reply, ScriptedBehaviour
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    SubagentError,
    TurnEnd,
    TurnStart,
    new_message_id,
)
from subagents.store import MemoryStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory", "sqlite-strict", "sqlite-relaxed"])
def rts(request: pytest.FixtureRequest, backend: Backend, tmp_path: Path) -> Iterator[Runtime]:
    """A runtime on ``backend``: the memory store, or SQLite strict / relaxed."""
    if request.param == "memory":
        runtime = Runtime(MemoryStore(), backend=backend)
    else:
        durability = request.param.split("-")[1]
        runtime = Runtime(str(tmp_path / "s.db"), backend=backend, durability=durability)
    with runtime:
        yield runtime


def _taking(gate: Gate | None = None) -> ScriptedBehaviour:
    """Waits at ``gate`` (if any), then takes what was steered in at one safe point:
    the output is the turn's content followed by the steered contents."""
    steps: list[Any] = [] if gate is None else [Block(gate)]
    steps.append(Call(lambda t: [t.content, *(m.content for m in t.steering())]))
    return ScriptedBehaviour(steps)


def _turns(rt: Runtime, sid: Any) -> list[list[Any]]:
    """The log as turns: each turn's messages (its own first, then steered ones)."""
    turns: list[list[Any]] = []
    for record in rt.sessions.read(sid):
        event = record.event
        if isinstance(event, TurnStart):
            turns.append([])
        elif isinstance(event, MessageEvent):
            turns[-1].append(event.content)
    return turns


def test_a_steer_reaches_the_open_turn(rts: Runtime) -> None:
    """A message steered while a turn runs is seen by that turn at its safe point,
    is logged inside it, and runs no turn of its own."""
    gate = Gate("safe point")
    rts.models.register("taker", lambda _o: _taking(gate))
    agent = rts.spawn("taker")
    agent.followup("first")
    assert gate.wait_reached(10)
    result = agent.followup("turn left", steer=True)
    assert result.outcome == "steered"
    again = agent.followup("and right", steer="strict")
    assert again.outcome == "steered"
    gate.release()
    assert agent.wait_idle(10)
    ends = rts.sessions.turn_ends(agent.session_id)
    assert [e.output for e in ends] == [["first", "turn left", "and right"]]
    assert _turns(rts, agent.session_id) == [["first", "turn left", "and right"]]
    ids = [
        r.event.message_id for r in rts.sessions.read(agent.session_id) if r.event.type == "message"
    ]
    assert ids[1:] == [result.message_id, again.message_id]


def test_no_open_turn_queues_or_refuses(rts: Runtime) -> None:
    """With no turn open, ``steer=True`` queues the message as its own turn
    (``queued``) and ``steer="strict"`` raises ``TURN_NOT_OPEN``: nothing delivered,
    nothing left in the durable inbox."""
    rts.models.register("taker", lambda _o: _taking())
    agent = rts.spawn("taker")
    queued = agent.followup("later", steer=True)
    assert queued.outcome == "queued"
    assert agent.wait_idle(10)
    with pytest.raises(SubagentError) as err:
        agent.followup("now or never", steer="strict")
    assert err.value.code == ErrorCode.TURN_NOT_OPEN
    assert agent.wait_idle(10)
    assert _turns(rts, agent.session_id) == [["later"]]
    store = rts.sessions.persistence
    if store is not None:
        rts.sessions.flush()
        assert store.pending(agent.session_id) == []


def test_a_steer_the_turn_never_takes_runs_next(rts: Runtime) -> None:
    """A turn that ends without reaching a safe point after the steer: the message
    is not lost -- it runs as the next turn, once."""
    gate = Gate("no safe point")
    rts.models.register("busy", lambda _o: ScriptedBehaviour([Block(gate), Reply("done")]))
    agent = rts.spawn("busy")
    agent.followup("first")
    assert gate.wait_reached(10)
    assert agent.followup("by the way", steer=True).outcome == "steered"
    gate.release()
    assert agent.wait_idle(10)
    assert _turns(rts, agent.session_id) == [["first"], ["by the way"]]


def test_a_leftover_steer_runs_in_acceptance_order(rts: Runtime) -> None:
    """R-FUP-6: a steer the turn never took runs as a turn of its own in acceptance
    order, as a crash replays it -- after the follow-ups queued before it, before
    those accepted after it (it was put behind them), several leftovers in their
    own order. Repeated, with 0-2 plain follow-ups queued before and after."""
    gate = Gate("no safe point")
    first = {"go"}

    def busy(turn: Any) -> Any:
        if turn.content in first:
            gate.pass_through(turn.signal)
        return turn.content

    rts.models.register("busy", lambda _o: busy)
    agent = rts.spawn("busy")
    expected: list[list[Any]] = []
    for i in range(12):
        first.add(f"go{i}")
        agent.followup(f"go{i}")
        assert gate.wait_reached(10)
        before = [f"b{i}-{j}" for j in range((i // 3) % 3)]
        for p in before:
            agent.followup(p)
        steered = [f"s{i}a", f"s{i}b"]
        for s in steered:
            assert agent.followup(s, steer=True).outcome == "steered"
        plain = [f"p{i}-{j}" for j in range(i % 3)]
        for p in plain:
            agent.followup(p)
        gate.release()
        assert agent.wait_idle(10)
        gate = Gate("no safe point")
        expected += [[f"go{i}"], *([x] for x in before + steered + plain)]
    assert _turns(rts, agent.session_id) == expected


def test_bad_steer_values(rts: Runtime) -> None:
    agent = rts.spawn("echo")
    for bad in ("yes", 1, None, "STRICT"):
        with pytest.raises(SubagentError) as err:
            agent.followup("x", steer=bad)
        assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert agent.wait_idle(10)
    assert _turns(rts, agent.session_id) == []


def test_steers_racing_turn_ends(rts: Runtime, backend: Backend) -> None:
    """The race between a strict steer and the turn's end, forced 150 times: each
    turn waits at its own gate, then takes what was steered at one safe point and
    ends; the test releases the gate and steers after 0-3 yields. Whatever the
    interleaving, a steer is refused (``TURN_NOT_OPEN``, logged nowhere) or logged
    exactly once -- inside the turn or, after its safe point, as the next turn --
    and every turn completes."""
    rnd = random.Random(7)
    gates = {f"t{i}": Gate(f"t{i}") for i in range(150)}

    def wait_then_take(turn: Any) -> Any:
        gate = gates.get(turn.content)
        if gate is not None:
            gate.pass_through(turn.signal)
        return [turn.content, *(m.content for m in turn.steering())]

    rts.models.register("taker", lambda _o: ScriptedBehaviour([Call(wait_then_take)]))
    agent = rts.spawn("taker")
    outcomes: dict[str, str] = {}
    for i in range(150):
        agent.followup(f"t{i}")
        assert gates[f"t{i}"].wait_reached(10)
        gates[f"t{i}"].release()
        for _ in range(rnd.randrange(4)):
            backend.sleep(0)
        try:
            outcomes[f"s{i}"] = agent.followup(f"s{i}", steer="strict").outcome
        except SubagentError as exc:
            assert exc.code == ErrorCode.TURN_NOT_OPEN
            outcomes[f"s{i}"] = "refused"
        outcomes[f"t{i}"] = "plain"
    assert agent.wait_idle(20)
    turns = _turns(rts, agent.session_id)
    logged = [c for turn in turns for c in turn]
    assert sorted(logged) == sorted(n for n, o in outcomes.items() if o != "refused")
    assert len(logged) == len(set(logged))
    ends = rts.sessions.turn_ends(agent.session_id)
    assert all(e.stop_reason == "completed" for e in ends)
    assert [e.output for e in ends] == turns
    # A steer is either in its turn or the very next turn: never later.
    for i, turn in enumerate(turns):
        for content in turn:
            if content.startswith("s") and turn[0] != content:
                assert turn[0] == "t" + content[1:]
            elif content.startswith("s"):
                assert turns[i - 1][0] == "t" + content[1:]


def test_child_steering_and_no_cold_resume(rts: Runtime) -> None:
    """Through the subagent service: a resident child's open turn is steered; a
    settled child is not resumed by a strict steer (``TURN_NOT_OPEN``) and a plain
    steer follows it up as usual (``queued``)."""
    gate = Gate("child")
    rts.models.register("taker", lambda _o: _taking(gate))
    parent = rts.spawn("echo")
    child = rts.subagents.start_continuable(
        ContinuableStartSpec(
            parent=parent, provider="local", prompt="work", label="worker", model="taker"
        )
    )
    assert gate.wait_reached(10)
    steered = rts.subagents.followup(parent, child.child_id, "steer here", steer=True)
    assert steered.outcome == "steered"
    gate.release()
    assert rts.wait_idle(10)
    assert _turns(rts, child.child_id)[0] == ["work", "steer here"]
    before = len(rts.sessions.read(child.child_id))
    with pytest.raises(SubagentError) as err:
        rts.subagents.followup(parent, child.child_id, "too late", steer="strict")
    assert err.value.code == ErrorCode.TURN_NOT_OPEN
    assert rts.wait_idle(10)
    assert len(rts.sessions.read(child.child_id)) == before
    queued = rts.subagents.followup(parent, child.child_id, "next", steer=True)
    assert queued.outcome == "queued"
    gate.release()
    assert rts.wait_idle(10)
    ends = [e for e in rts.sessions.turn_ends(child.child_id) if isinstance(e, TurnEnd)]
    assert ends[-1].output == ["next"]


@pytest.mark.parametrize("how", ["cancel", "dispose", "drain"])
def test_a_cancel_that_drops_the_inbox_drops_what_was_steered(rts: Runtime, how: str) -> None:
    """R-INT-1, R-DRAIN-1: a message steered into the open turn and not taken yet
    was accepted before a cancel without ``keep_inbox`` (a drain, a dispose): it is
    discarded with the rest -- logged as a turn that ended ``cancelled``
    (``discarded unrun``), gone from the durable inbox. It used to run as a new
    turn after the cancel or the drain, and after a dispose it stayed in the
    durable inbox for the sweep to bring the disposed agent back."""
    gate = Gate("no safe point")
    rts.models.register("busy", lambda _o: ScriptedBehaviour([Block(gate), Reply("done")]))
    if how == "drain":
        parent = rts.spawn("echo", label="parent")
        spec = ContinuableStartSpec(
            parent=parent, provider="local", prompt="first", label="kid", model="busy"
        )
        sid, _ = rts.subagents.start_continuable(spec)
        agent = rts.agents.get(sid)
        assert agent is not None
    else:
        agent = rts.spawn("busy")
        sid = agent.session_id
        agent.followup("first")
    try:
        assert gate.wait_reached(10)
        assert agent.followup("by the way", steer=True).outcome == "steered"
        if how == "cancel":
            agent.cancel("stop", keep_inbox=False)
        elif how == "dispose":
            agent.dispose(wait=False)
        else:
            rts.subagents.drain_continuable_descendants([parent])
    finally:
        gate.release()
    if how == "cancel":
        assert agent.wait_idle(10)
    else:
        assert agent.wait_disposed(10)
    assert rts.wait_idle(10)
    ends = rts.sessions.turn_ends(sid)
    assert [e.stop_reason for e in ends] == ["cancelled", "cancelled"], ends
    assert ends[1].error == "discarded unrun"
    assert _turns(rts, sid) == [["first"], ["by the way"]]
    store = rts.sessions.persistence
    if store is not None and rts.sessions.strict:
        rts.sessions.flush()
        assert store.pending(sid) == []


def test_a_steer_while_a_leftover_is_discarded_is_a_turn_of_its_own(rts: Runtime) -> None:
    """Race, forced: a message steered while a leftover of the cancelled turn is
    being recorded as ``discarded unrun`` -- accepted after the cancel -- is no
    part of that record: it queues and runs (it was steered into the record and
    neither ran nor was logged, the agent idle)."""
    gate = Gate("no safe point")
    rts.models.register("busy", lambda _o: ScriptedBehaviour([Block(gate), Reply("done")]))
    agent = rts.spawn("busy")
    agent.followup("first")
    late: list[Any] = []
    try:
        assert gate.wait_reached(10)
        assert agent.followup("by the way", steer=True).outcome == "steered"
        agent.cancel("stop", keep_inbox=False)
        begin = rts.sessions.begin_turn

        def begin_turn(live: Any, record: Any) -> None:
            begin(live, record)
            if record.content == "by the way" and not late:
                late.append(agent.followup("late", steer=True))  # from the actor itself

        rts.sessions.begin_turn = begin_turn  # type: ignore[method-assign]
    finally:
        gate.release()
    assert agent.wait_idle(10)
    assert [steered.outcome for steered in late] == ["queued"]
    assert _turns(rts, agent.session_id) == [["first"], ["by the way"], ["late"]]
    ends = rts.sessions.turn_ends(agent.session_id)
    assert [(e.stop_reason, e.error) for e in ends][1:] == [
        ("cancelled", "discarded unrun"),
        ("completed", None),
    ]


@pytest.mark.parametrize("durability", ["strict", "relaxed"])
@pytest.mark.parametrize("by", ["parent", "parent id", "elsewhere"])
@pytest.mark.parametrize("resident", [True, False])
def test_a_repeated_steer_to_a_child_is_a_duplicate(
    backend: Backend, tmp_path: Path, durability: str, by: str, resident: bool
) -> None:
    """R-FUP-3: a steering follow-up repeated with its ``message_id`` says
    ``duplicate`` (nothing new queued) whichever way it reaches the child -- by the
    live parent or by its id (``elsewhere``: from a runtime where the parent is
    not live, on the same store), to a resident child or a settled one (through
    the store's deduplication under strict durability it said ``queued``)."""
    if by == "elsewhere" and durability == "relaxed":
        pytest.skip("relaxed: a session another runtime holds is LEASE_HELD by id")
    db = str(tmp_path / "s.db")
    warm = 60.0 if resident else 0.0
    with (
        Runtime(db, backend=backend, durability=durability, keep_warm=warm) as rt,
        Runtime(db, backend=backend) as other,
    ):
        rt.models.register("w", lambda _o: lambda turn: f"did {turn.content}")
        parent = rt.spawn("w")
        child = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=parent, provider="local", prompt="p", label="c", model="w")
        ).child_id
        assert rt.wait_idle(10)
        who: Any = parent if by == "parent" else parent.session_id
        via = other if by == "elsewhere" else rt
        for i in range(3):
            mid = new_message_id()
            first = via.subagents.followup(who, child, f"b{i}", steer=True, message_id=mid)
            assert first == (mid, "queued")
            assert rt.wait_idle(10)
            agent = rt.agents.get(child)
            if not resident:  # settled: it leaves residency once idle
                assert agent is None or agent.wait_disposed(10)
                agent = rt.agents.get(child)
            assert (agent is not None) is resident
            again = via.subagents.followup(who, child, f"b{i}", steer=True, message_id=mid)
            assert again == (mid, "duplicate")
            assert rt.wait_idle(10)
        expected = ["did p", "did b0", "did b1", "did b2"]
        deadline = time.monotonic() + 10  # elsewhere: run here once the ring arrives
        while [e.output for e in rt.sessions.turn_ends(child)] != expected:
            assert time.monotonic() < deadline, rt.sessions.turn_ends(child)
            backend.sleep(0.005)
