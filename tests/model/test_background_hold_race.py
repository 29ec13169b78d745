"""A background ``delegate`` started while an earlier one finishes keeps its agent
resident (R-ONE-7: one result per run, delivered; R-RES-4: a child stays while
work it started runs).

The agent's residency hold is taken before a background run starts and given up
when the last run is disposed. A run still being started was not counted: an
earlier run finishing meanwhile gave the hold up, the new run was added with no
hold, the continuable child settled as its turn ended, and its disposal cancelled
the new run -- whose result never came back. Forced: the provider's start of the
second run returns only once the first run was disposed and the hold's release
was asked.
"""

from __future__ import annotations

from typing import Any

import pytest
from subagents.actors import (
    ContinuableStartSpec,
    ResultFuture,
    RunResult,
    Runtime,
    SubagentRun,
    ToolDispatcher,
    Turn,
)
from subagents.actors._kernel._backend import Backend
from subagents.protocol import new_session_id
from subagents.store import MemoryStore

pytestmark = pytest.mark.timeout(60)

WAIT = 30.0


def _done(output: str) -> RunResult:
    return RunResult(output=output, structured=None, stop_reason="completed")


class _Provider:
    """Runs nothing itself: the test sets each run's result. Its second start waits
    until the first run's finish asked to release the hold."""

    name = "manual"
    capabilities = frozenset[str]()
    inherits_parent_context = False

    def __init__(self, rt: Runtime, released: Any) -> None:
        self.rt = rt
        self.futures: list[ResultFuture[RunResult]] = []
        self.released = released  # set when the first run's finish asked to release

    def start(self, request: Any, descriptor: Any) -> SubagentRun:
        if len(self.futures) == 1:
            self.futures[0].set_result(_done("out1"))  # the first run ends now...
            assert self.released.wait(WAIT)  # ...and is disposed while this one starts
        future: ResultFuture[RunResult] = ResultFuture()
        self.futures.append(future)
        return SubagentRun(
            id=new_session_id(), local_agent=None, result=future, dispose=lambda _t: None
        )


def test_a_run_started_as_another_finishes_keeps_its_agent_resident(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Runtime(MemoryStore(), backend=backend) as rt:
        released = rt.backend.event()
        real = ToolDispatcher._release_if_idle

        def release_if_idle(self: Any, state: Any) -> None:
            real(self, state)
            released.set()

        monkeypatch.setattr(ToolDispatcher, "_release_if_idle", release_if_idle)
        provider = _Provider(rt, released)
        rt.subagents.register_provider(provider)
        dispatcher = ToolDispatcher()
        seen: list[Any] = []
        second = rt.backend.event()

        def kid(turn: Turn) -> None:
            if turn.index == 0:
                for prompt in ("p1", "p2"):
                    dispatcher.dispatch(
                        turn,
                        "delegate",
                        {"prompt": prompt, "provider": "manual", "background": True},
                    )
            else:
                seen.append(turn.content["delegate_result"].get("output"))
                if seen[-1] == "out2":
                    second.set()

        rt.models.register("kid", lambda _o: kid)
        host = rt.spawn("echo", label="host")
        spec = ContinuableStartSpec(
            parent=host, provider="local", prompt="go", label="kid", model="kid"
        )
        kid_id = rt.subagents.start_continuable(spec).child_id
        agent = rt.agents.get(kid_id)
        assert agent is not None
        while len(provider.futures) < 2:  # a deadline poll: the second run started
            released.wait(0.01)
        assert agent.wait_idle(WAIT)  # its turns so far ran: the second run is out
        cont = rt.continuation
        for _ in range(2):  # the registry and supervisor handled its idle notice
            cont._registry.ask(lambda: None)
            cont._supervisor.ask(lambda: None)
        assert cont.activation(kid_id) is not None, "it settled under a running background run"
        provider.futures[1].set_result(_done("out2"))
        assert second.wait(WAIT), f"the second run's result never came back: {seen}"
