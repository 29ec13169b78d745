"""A continuable child whose running turn has an abort listener, its session then
deleted from the shared in-memory store (as another holder of the store would):
its next inline write fails, and the stop that follows runs the listener. Shared
by the tests of failed inline writes (tests/runtime, tests/actors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from subagents.actors import Agent, ContinuableStartSpec, Runtime
from subagents.store import MemoryStore


def listening_child(
    rt: Runtime, store: MemoryStore, listener_for: Callable[[Any, Any], Callable[[Any], None]]
) -> tuple[Any, Any, Agent]:
    """``(parent, child_id, child_agent)``: a child of a new ``echo`` parent whose
    first turn adds ``listener_for(turn, parent)`` to its signal and waits for the
    abort; returned once that turn runs, with the child's session deleted from
    ``store`` (nothing written yet fails: the next write does)."""
    inside = rt.backend.event()
    parent = rt.spawn("echo")

    def model(_options: Any) -> Any:
        def on_turn(turn: Any) -> str:
            turn.signal.add_listener(listener_for(turn, parent))
            inside.set()
            assert turn.signal.wait(30)
            return "stopped"

        return on_turn

    rt.models.register("listening", model)
    spec = ContinuableStartSpec(
        parent=parent, provider="local", prompt="go", label="c", model="listening"
    )
    child = rt.subagents.start_continuable(spec).child_id
    assert inside.wait(30)
    agent = rt.agents.get(child)
    assert agent is not None
    store.delete_session(child)
    return parent, child, agent
