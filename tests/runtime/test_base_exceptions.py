"""A behaviour that raises ``SystemExit``, ``KeyboardInterrupt`` or
``GeneratorExit`` (a tool's ``sys.exit``, say) fails its own turn and touches
nothing else: out of its actor, pykka stops every actor of the process -- every
agent of every runtime, and the runtime's registry and supervisor with them."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.store import MemoryStore

RAISED = {
    "SystemExit": lambda: sys.exit(0),
    "KeyboardInterrupt": lambda: (_ for _ in ()).throw(KeyboardInterrupt()),
    "GeneratorExit": lambda: (_ for _ in ()).throw(GeneratorExit()),
}


def test_a_behaviour_raising_greenlet_exit_stops_no_other_agent(backend: Backend) -> None:
    """A behaviour's ``GreenletExit`` (a greenlet's kill, on gevent) never reaches
    pykka's loop, which would stop every actor of the process -- another runtime's
    too. On threads it fails its turn alone; on gevent the agent whose greenlet it
    ends stops, and only it: what it accepted stays for its next activation."""
    import greenlet

    def raiser(turn: Any) -> Any:
        if turn.content == "quit":
            raise greenlet.GreenletExit
        return f"still here: {turn.content}"

    with (
        Runtime(MemoryStore(), backend=backend) as other,
        Runtime(MemoryStore(), backend=backend) as rt,
    ):
        bystander = other.spawn("echo", label="bystander")
        agent = rt.spawn(raiser)
        neighbour = rt.spawn("echo", label="neighbour")
        agent.followup("quit")
        if backend.name == "gevent":
            assert agent.wait_disposed(10)
        else:
            assert agent.wait_idle(10)
            ends = rt.sessions.turn_ends(agent.session_id)
            assert ends[-1].stop_reason == "failed"
            assert (ends[-1].error or "").startswith("GreenletExit")
            agent.followup("again")
            assert agent.wait_idle(10)
            assert rt.sessions.turn_ends(agent.session_id)[-1].output == "still here: again"
        for someone, runtime in ((bystander, other), (neighbour, rt)):
            someone.followup("ping")
            assert someone.wait_idle(10)
            assert runtime.sessions.turn_ends(someone.session_id)[-1].output == "ping"


@pytest.mark.parametrize("kind", list(RAISED))
def test_a_base_exception_fails_its_turn_alone(backend: Backend, kind: str) -> None:
    raise_it = RAISED[kind]

    def quitter(turn: Any) -> Any:
        if turn.content == "quit":
            raise_it()
        return f"still here: {turn.content}"

    with (
        Runtime(MemoryStore(), backend=backend) as other,
        Runtime(MemoryStore(), backend=backend) as rt,
    ):
        bystander = other.spawn("echo", label="bystander")
        rt.models.register("quitter", lambda _o: quitter)
        parent = rt.spawn("echo", label="parent")
        child = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=parent, provider="local", prompt="hello", label="q", model="quitter"
            )
        ).child_id
        assert rt.wait_idle(10)
        rt.subagents.followup(parent, child, "quit")
        assert rt.wait_idle(10)
        ends = rt.sessions.turn_ends(child)
        assert [e.stop_reason for e in ends] == ["completed", "failed"]
        assert (ends[1].error or "").startswith(kind)
        # The child, its parent's authority over it, and the other runtime go on.
        rt.subagents.followup(parent, child, "again")
        assert rt.wait_idle(10)
        assert rt.sessions.turn_ends(child)[-1].output == "still here: again"
        bystander.followup("ping")
        assert bystander.wait_idle(10)
        assert other.sessions.turn_ends(bystander.session_id)[-1].output == "ping"
