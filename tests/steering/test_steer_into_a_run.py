"""A steer racing the end of a turn inside a run of queued turns (R-FU-1: every
accepted message runs; issue 16 point 4, steering).

A run of queued turns (``actors/_agents/_run.py``) goes on to the next queued
turn without the inbox's lock once it finds nothing steered into the turn that
ended. A steerer that read that turn as open, under the lock, and put its box on
it only after that look, steered into a turn nobody settles: its message never
ran, and the agent never became idle again. The steerer is held right there
(threads: a switch can come at any bytecode; gevent never switches under the
lock), the run ends the turn and goes on, then the steerer goes on.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._agents import _inbox
from subagents.actors.testing import Gate
from subagents.store import MemoryStore

pytestmark = [pytest.mark.timeout(60), pytest.mark.backend_specific]


def _round(monkeypatch: pytest.MonkeyPatch, real: Any) -> None:
    in_lock, go = threading.Event(), threading.Event()
    made: list[int] = []

    def held_box() -> Any:
        made.append(1)
        if len(made) == 1:  # the steerer: lock held, turn A read as open
            in_lock.set()
            assert go.wait(30)
        return real()

    monkeypatch.setattr(_inbox, "SteerBox", held_box)
    gate, b_started = Gate("first"), threading.Event()
    seen: list[Any] = []
    with Runtime(MemoryStore(), backend="threading") as rt:

        def behaviour(turn: Any) -> None:
            seen.append(turn.content)
            if turn.content == "first":
                gate.pass_through(turn.signal)
            elif turn.content == "A":
                assert in_lock.wait(30)  # A ends while the steer is held
            elif turn.content == "B":
                b_started.set()

        agent = rt.spawn(behaviour)
        agent.followup("first")
        assert gate.wait_reached(30)
        agent.followup("A")
        agent.followup("B")  # queued behind A: one run takes A, then B
        gate.release()
        out: dict[str, Any] = {}
        steerer = threading.Thread(
            target=lambda: out.update(r=agent.followup("STEERED", steer=True))
        )
        while agent.running_turn != 1:  # a deadline poll: turn A is open
            in_lock.wait(0.001)
        steerer.start()
        assert b_started.wait(30)  # the run went on to B, the steerer still held
        go.set()
        steerer.join(30)
        assert not steerer.is_alive()
        assert agent.wait_idle(30), "the steered message never settled"
        assert "STEERED" in seen
        assert out["r"].outcome in ("steered", "queued")


def test_a_steer_into_a_turn_a_run_ended_meanwhile_still_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = _inbox.SteerBox
    for _ in range(5):
        _round(monkeypatch, real)
