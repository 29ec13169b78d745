"""A turn is recorded as one compact record (issue 20 point 2), and nothing a reader
sees changes: the running turn's head is in the log while it runs, what other
callers log during a turn lies between its message and its end, a store that takes
events gets events, and the end is dated by the turn's own duration.

R-PROJ-3 (active time is the sum of the turn/start -> turn/end intervals), R-INT-6
(an interrupt is logged in the interrupted child's session), R-REG-9 (same-process
values are borrowed, not copied).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import freezegun
import pytest
from subagents.actors import ContinuableStartSpec, Runtime, UserAuthority
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import (
    Event,
    InterruptEvent,
    MessageEvent,
    SessionId,
    TurnEnd,
    TurnRecord,
    TurnStart,
)
from subagents.store import MemoryStore


class EventsOnly(MemoryStore):
    """A store with an append of its own: it must be handed events, never records."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[Any] = []

    def append(self, session_id: SessionId | str, events: Sequence[Event], **kw: Any) -> list[int]:
        self.handed.extend(events)
        return super().append(session_id, events, **kw)


def _types(records: Sequence[Any]) -> list[str]:
    return [type(r.event).__name__ for r in records]


def test_the_running_turn_is_in_the_log_and_an_interrupt_lands_inside_it(
    backend: Backend,
) -> None:
    """While a child's turn runs, a read of its session shows ``turn/start`` and the
    message; an interrupt logged meanwhile comes after them and before the turn's
    end; afterwards the store holds the same log the runtime reads, built from the
    turn's record."""
    store = MemoryStore()
    with Runtime(store, backend=backend) as rt:
        gate = Gate()

        def child(turn: Any) -> Any:
            if turn.index == 1:
                gate.pass_through(turn.signal)
            return f"turn {turn.index}"

        rt.models.register("child", lambda _o: child)
        root = rt.spawn("echo", label="root")
        handle = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=root, provider="local", prompt="go", label="kid", model="child"
            )
        )
        cid = handle.child_id
        rt.subagents.followup(root, cid, "wait here")  # resident or cold-resumed: turn 1
        assert gate.wait_reached(10)
        agent = rt.agents.get(cid)
        assert agent is not None
        during = rt.sessions.read(cid)
        assert _types(during[-2:]) == ["TurnStart", "MessageEvent"]
        assert during[-1].event.content == "wait here"
        rt.subagents.interrupt(cid, UserAuthority(root.session_id))
        assert agent.wait_idle(10)
        log = rt.sessions.read(cid)
        assert _types(log[-4:]) == ["TurnStart", "MessageEvent", "InterruptEvent", "TurnEnd"]
        assert isinstance(log[-2].event, InterruptEvent)
        end = log[-1].event
        assert isinstance(end, TurnEnd) and end.stop_reason == "cancelled" and end.turn == 1
        assert [r.seq for r in log] == list(range(len(log)))
        # The store holds the record itself (compact) and reads back the same events.
        assert any(type(slot) is TurnRecord for slot in store._sessions[cid].events)
        assert [(r.seq, r.event) for r in store.read(cid)] == [(r.seq, r.event) for r in log]


def test_a_store_with_its_own_append_is_handed_events(backend: Backend) -> None:
    """A store whose ``append`` is its own (a subclass hook) is written with the
    events a turn stands for, in log order, never a record."""
    store = EventsOnly()
    with Runtime(store, backend=backend) as rt:
        agent = rt.spawn(lambda t: f"re: {t.content}")
        for i in range(3):
            agent.followup(i)
        assert agent.wait_idle(10)
        sid = agent.session_id
        assert not any(type(e) is TurnRecord for e in store.handed)
        assert [type(e) for e in store.handed].count(TurnEnd) == 3
        assert [r.event for r in store.read(sid)] == [r.event for r in rt.sessions.read(sid)]
        assert [e.output for e in rt.sessions.turn_ends(sid)] == ["re: 0", "re: 1", "re: 2"]


def test_the_end_is_dated_by_the_turn_s_duration(backend: Backend) -> None:
    """With the system clock, a turn reads the time once: its end is its start plus
    the time the turn took (frozen and stepped here, so the duration is exact)."""
    with freezegun.freeze_time("2026-06-01 12:00:00", tick=False) as frozen:

        def slow(turn: Any) -> Any:
            frozen.tick(dt.timedelta(seconds=42))
            return "done"

        with Runtime(backend=backend) as rt:
            agent = rt.spawn(slow)
            agent.followup("x")
            assert agent.wait_idle(10)
            events = [r.event for r in rt.sessions.read(agent.session_id)]
    starts = [e for e in events if isinstance(e, TurnStart)]
    ends = [e for e in events if isinstance(e, TurnEnd)]
    assert len(starts) == len(ends) >= 1
    for start, end in zip(starts, ends, strict=True):
        assert end.at - start.at == dt.timedelta(seconds=42)


@pytest.mark.parametrize("step", [1.0, 0.0])
def test_an_injected_clock_is_asked_again_for_the_end(backend: Backend, step: float) -> None:
    """A runtime given a clock takes a turn's end time from that clock too (it
    defines time for the runtime), never from the duration."""
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    calls: list[dt.datetime] = []

    def clock() -> dt.datetime:
        calls.append(t0 + dt.timedelta(seconds=step * len(calls)))
        return calls[-1]

    with Runtime(backend=backend, clock=clock) as rt:
        agent = rt.spawn(lambda t: t.content)
        agent.followup("x")
        assert agent.wait_idle(10)
        events = [r.event for r in rt.sessions.read(agent.session_id)]
    pairs = [(e.at, type(e)) for e in events if isinstance(e, (TurnStart, TurnEnd))]
    assert pairs and all(at in calls for at, _ in pairs)
    if step:
        for (start, _), (end, _) in zip(pairs[::2], pairs[1::2], strict=True):
            assert end > start


def test_a_message_that_cannot_be_recorded_fails_its_turn_and_keeps_the_log(
    backend: Backend,
) -> None:
    """An output the log cannot hold fails the turn with a recorded reason, and the
    record's end says so in the store as well as in the runtime's read."""
    store = MemoryStore()
    with Runtime(store, backend=backend) as rt:
        agent = rt.spawn(lambda t: object() if t.content == "bad" else "ok")
        agent.followup("bad")
        agent.followup("fine")
        assert agent.wait_idle(10)
        ends = rt.sessions.turn_ends(agent.session_id)
        assert [e.stop_reason for e in ends[-2:]] == ["failed", "completed"]
        assert ends[-2].output is None and "cannot be recorded" in (ends[-2].error or "")
        stored = [r.event for r in store.read(agent.session_id)]
        assert [e for e in stored if isinstance(e, TurnEnd)] == ends
        assert [e.content for e in stored if isinstance(e, MessageEvent)][-2:] == ["bad", "fine"]


def test_a_turn_s_start_time_is_the_one_it_logged(backend: Backend) -> None:
    """Issue 20 point 2 (one wall-clock read a turn, dated when read): what a
    behaviour reads as ``turn.started_at`` is its ``turn/start``'s time, an aware
    UTC datetime, between the times read around the follow-ups; the end follows it."""
    seen: list[Any] = []
    before = dt.datetime.now(dt.UTC)
    with Runtime(backend=backend) as rt:
        agent = rt.spawn(lambda turn: seen.append(turn.started_at))
        for i in range(3):
            agent.followup(i)
        assert agent.wait_idle(10)
        events = [r.event for r in rt.sessions.read(agent.session_id)]
    after = dt.datetime.now(dt.UTC)
    starts = [e.at for e in events if isinstance(e, TurnStart)]
    ends = [e.at for e in events if isinstance(e, TurnEnd)]
    assert seen == starts and len(starts) == 3
    for start, end in zip(starts, ends, strict=True):
        assert start.tzinfo is dt.UTC
        assert before - dt.timedelta(milliseconds=1) <= start <= end <= after
