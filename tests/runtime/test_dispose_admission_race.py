"""A follow-up accepted as ``dispose`` stops the agent (R-FU-1: an accepted message
is run or recorded, never silently dropped; R-LIFE: dispose discards queued
messages unrun, in the log).

The follow-up was numbered and counted under the agent's lock and put in the
actor's mailbox after it: a ``dispose`` in between marked the agent, covered the
message with its discard watermark and queued the actor's stop ahead of it, and
pykka's teardown dropped the message behind the stop -- ``followup`` had returned
its id, and the log held neither its turn nor its discard. Forced here: the
follower is held as it builds the message, and ``dispose`` runs in another thread
once it reached the agent's lock (threads; gevent cannot switch in between).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._agents import _inbox, _loop
from subagents.actors.testing import Gate
from subagents.protocol import MessageEvent, TurnEnd
from subagents.store import MemoryStore

pytestmark = [pytest.mark.timeout(60), pytest.mark.backend_specific]


class _WatchedLock:
    """The agent's lock; ``wanted`` is set once ``thread`` asks for it."""

    def __init__(self, lock: Any, thread: threading.Thread) -> None:
        self._lock, self._thread = lock, thread
        self.wanted = threading.Event()

    def __enter__(self) -> bool:
        if threading.current_thread() is self._thread:
            self.wanted.set()
        return bool(self._lock.acquire())

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def _round(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _inbox.Deliver
    building, go = threading.Event(), threading.Event()

    def held_deliver(n: int, mid: Any, content: Any, *rest: Any) -> Any:
        if content == "x":
            building.set()  # counted in; not in the mailbox yet
            assert go.wait(30)
        return real(n, mid, content, *rest)

    monkeypatch.setattr(_inbox, "Deliver", held_deliver)
    store = MemoryStore()
    with Runtime(store, backend="threading") as rt:
        gate = Gate("first")
        rt.models.register("hold", lambda _o: lambda turn: gate.pass_through(None))
        agent = rt.spawn("hold")
        agent.followup("first")
        assert gate.wait_reached(30)  # the actor is busy: a stop queues behind
        out: dict[str, Any] = {}
        follower = threading.Thread(target=lambda: out.update(mid=agent.followup("x")))
        follower.start()
        assert building.wait(30)
        disposer = threading.Thread(target=agent.dispose, kwargs={"wait": False})
        watched = _WatchedLock(agent._lock, disposer)
        monkeypatch.setattr(agent, "_lock", watched)
        disposer.start()
        assert watched.wanted.wait(30)  # dispose is at the lock (or past it)
        go.set()
        follower.join(30)
        disposer.join(30)
        gate.release()
        assert agent.wait_disposed(30)
        records = store.read(agent.session_id)
        if "mid" in out:  # accepted: run, or in the log as discarded unrun
            mid = out["mid"]
            assert any(
                isinstance(r.event, MessageEvent) and r.event.message_id == mid for r in records
            ), "an accepted follow-up left no trace"
            ends = [r.event for r in records if isinstance(r.event, TurnEnd)]
            assert ends[-1].stop_reason in ("cancelled", "completed")


def test_a_follow_up_accepted_as_dispose_stops_the_agent_is_never_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for _ in range(5):
        _round(monkeypatch)
        monkeypatch.undo()


def _claimed_round(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _loop.Turn
    in_window, go = threading.Event(), threading.Event()

    def held_turn(agent: Any, index: int, d: Any, *rest: Any) -> Any:
        if d.content == "M":
            in_window.set()  # M taken off the mailbox and checked; its turn not open yet
            assert go.wait(30)
        return real(agent, index, d, *rest)

    monkeypatch.setattr(_loop, "Turn", held_turn)
    saw: dict[str, bool] = {}
    with Runtime(MemoryStore(), backend="threading") as rt:
        gate = Gate("first")

        def behaviour(turn: Any) -> None:
            if turn.content == "first":
                gate.pass_through(turn.signal)
            else:
                saw[turn.content] = turn.signal.aborted

        agent = rt.spawn(behaviour)
        agent.followup("first")
        assert gate.wait_reached(30)
        agent.followup("M")
        agent.followup("after")
        gate.release()
        assert in_window.wait(30)
        agent.dispose(wait=False)  # its cancel finds no open turn
        go.set()
        assert agent.wait_disposed(30)
    assert saw == {"M": True}  # M ran as the cancelled turn; "after" was discarded unrun


def test_a_dispose_between_a_message_taken_and_its_turn_opening_cancels_that_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The actor took M off its mailbox and found it above the discard watermark;
    before its turn is open, dispose's cancel finds no turn to abort and moves the
    watermark over M. M's turn then sees the watermark and is the turn that cancel
    cancelled: its signal is aborted before its behaviour starts (it ran in full,
    un-aborted, and dispose waited for it)."""
    for _ in range(5):
        _claimed_round(monkeypatch)
        monkeypatch.undo()
