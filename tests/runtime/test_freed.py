"""A disposed agent is freed by reference counting, as soon as its last user lets go:
nothing the runtime keeps (a list of agents still disposing, the turn runner's way
back to its agent, the last turn) holds it, and no reference cycle leaves it to the
cycle collector -- which, with thousands of children disposed, ran full collections
of the whole heap and cost a one-shot cycle a tenth of its time.

R-ONE-10 (a one-shot run's resources are released on dispose), R-RES-1 (a settled
continuable child leaves residency).
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from subagents.actors import AbortSignal, ContinuableStartSpec, Runtime, SubagentStartRequest
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.store import MemoryStore


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.usefixtures("no_cycle_collector")
def test_disposed_one_shot_children_are_freed_without_the_cycle_collector(
    backend: Backend,
) -> None:
    """Fifty one-shot runs, each started, awaited and disposed: with the cycle
    collector off, every child agent is gone once its run is dropped."""
    refs: list[weakref.ref[Any]] = []
    with Runtime(backend=backend) as rt:
        parent = rt.spawn("echo")
        for i in range(50):
            run = rt.subagents.start(
                "local", SubagentStartRequest(parent=parent, prompt=i, signal=AbortSignal.never())
            )
            assert run.local_agent is not None
            refs.append(weakref.ref(run.local_agent))
            assert run.result.get(10) is not None
            run.dispose()
            assert run.local_agent.wait_disposed(10)
            del run
        alive = sum(ref() is not None for ref in refs)
        assert alive == 0, f"{alive} of 50 disposed agents are still referenced"


@pytest.mark.usefixtures("no_cycle_collector")
def test_disposed_top_level_agents_are_freed_without_the_cycle_collector(
    backend: Backend,
) -> None:
    """A top-level agent that ran turns and was disposed is freed when the caller
    drops it (its runner, last turn and session go with it)."""
    with Runtime(backend=backend) as rt:
        refs = []
        for _ in range(10):
            agent = rt.spawn(lambda t: f"re: {t.content}")
            agent.followup("a")
            agent.followup("b")
            assert agent.wait_idle(10)
            agent.dispose()
            refs.append(weakref.ref(agent))
            del agent
        assert all(ref() is None for ref in refs)


@pytest.mark.usefixtures("no_cycle_collector")
def test_settled_continuable_children_are_freed_without_the_cycle_collector(
    backend: Backend,
) -> None:
    """A continuable child that settled (its residency listeners close over its
    activation, which holds the agent) is freed once it left residency."""
    with Runtime(MemoryStore(), backend=backend) as rt:
        gates = [Gate() for _ in range(6)]

        def child(turn: Any) -> Any:
            gates[turn.content].pass_through(turn.signal)
            return "done"

        rt.models.register("child", lambda _o: child)
        root = rt.spawn("echo")
        refs = []
        for i, gate in enumerate(gates):
            handle = rt.subagents.start_continuable(
                ContinuableStartSpec(
                    parent=root, provider="local", prompt=i, label=f"kid{i}", model="child"
                )
            )
            assert gate.wait_reached(10)
            agent = rt.agents.get(handle.child_id)
            assert agent is not None
            if i < 5:  # the sixth moves the registry's loop past the fifth's last notice
                refs.append(weakref.ref(agent))
            gate.release()
            assert agent.wait_disposed(10)  # settled: it left residency
            del agent, handle
        # The supervisor retires each activation after its agent's disposal ended.
        deadline = time.monotonic() + 10
        while rt.continuation.activations() and time.monotonic() < deadline:
            rt.backend.sleep(0.001)
        assert not rt.continuation.activations()
        alive = sum(ref() is not None for ref in refs)
        assert alive == 0, f"{alive} of 5 settled children are still referenced"
