"""A background ``delegate`` result that settled but is still being delivered
keeps its continuable child resident (R-SETUP-*, issue 16 point 1): the forced
interleaving of the race a parallel tool call could lose it to."""

from __future__ import annotations

from typing import Any

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
from subagents.actors.testing import Gate, wait_quiescent
from subagents.protocol import new_session_id


class ManualProvider:
    """One-shot runs whose results the test settles; each result's first done
    callback waits at ``delivering`` (before the dispatcher's delivery runs)."""

    name = "manual"
    capabilities: frozenset[str] = frozenset()
    inherits_parent_context = False

    def __init__(self) -> None:
        self.delivering = Gate("delivering")
        self.futures: list[ResultFuture[RunResult]] = []
        self.disposed: list[Any] = []

    def start(self, request: Any, descriptor: Any) -> SubagentRun:
        future: ResultFuture[RunResult] = ResultFuture()
        future.add_done_callback(lambda _f: self.delivering.pass_through())
        self.futures.append(future)
        rid = new_session_id()
        return SubagentRun(
            id=rid, local_agent=None, result=future, dispose=lambda _t: self.disposed.append(rid)
        )


def _delegate_and_settle(
    dispatcher: ToolDispatcher, provider: ManualProvider, turn: Turn, backend: Backend
) -> None:
    """A background ``delegate`` of ``turn``; its run's result set from another task."""
    dispatcher.dispatch(turn, "delegate", {"prompt": "p", "provider": "manual", "background": True})
    (future,) = provider.futures
    result = RunResult(output="out", structured=None, stop_reason="completed")
    backend.spawn(future.set_result, result)


def _start_kid(rt: Runtime, kid: Any) -> Any:
    """A continuable child running behaviour ``kid`` under a host; its id."""
    rt.models.register("kid", lambda _o: kid)
    host = rt.spawn("echo", label="host")
    return rt.subagents.start_continuable(
        ContinuableStartSpec(parent=host, provider="local", prompt="go", label="kid", model="kid")
    ).child_id


def test_a_result_still_being_delivered_keeps_its_child_resident(
    rt: Runtime, backend: Backend
) -> None:
    """The run settles; before its result is delivered another tool call of the same
    turn disposes settled runs. The run is not disposed, the child does not settle,
    and the result runs as the child's next turn (it was dropped: the child had
    settled when the delivery came)."""
    provider = ManualProvider()
    rt.subagents.register_provider(provider)
    dispatcher = ToolDispatcher()
    contents: list[Any] = []
    first_done, second_done = backend.event(), backend.event()

    def kid(turn: Turn) -> Any:
        if turn.index == 0:
            _delegate_and_settle(dispatcher, provider, turn, backend)
            assert provider.delivering.wait_reached(10)
            dispatcher.dispatch(turn, "list_agents", {})  # disposes what it may
            first_done.set()
        else:
            contents.append(turn.content)
            dispatcher.dispose_settled(turn)
            second_done.set()
        return None

    kid_id = _start_kid(rt, kid)
    assert first_done.wait(10)
    agent = rt.agents.get(kid_id)
    assert agent is not None
    # The old dispatcher disposed the run and let the child settle here.
    assert not agent.wait_disposed(1.0)
    assert provider.disposed == []
    provider.delivering.release()
    assert second_done.wait(20)
    assert agent.wait_disposed(20)  # it settles once the run was disposed
    assert wait_quiescent(rt, 20)
    assert [c["delegate_result"]["output"] for c in contents] == ["out"]
    assert len(provider.disposed) == 1


def test_a_result_delivered_just_before_its_turn_is_disposed(
    rt: Runtime, backend: Backend, monkeypatch: Any
) -> None:
    """The result is accepted into the child's inbox and its turn runs (its first
    step disposes settled runs) before the delivering thread goes on: the run is
    still disposed and the child settles (it kept its hold for ever)."""
    from subagents.actors._agents import _agent

    provider = ManualProvider()
    provider.delivering.release()
    rt.subagents.register_provider(provider)
    dispatcher = ToolDispatcher()
    second_ran = backend.event()
    accept = _agent.Agent.followup

    def followup_then_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        accepted = accept(self, *args, **kwargs)
        source = kwargs.get("source")
        if source is not None and source.kind == "child":
            assert second_ran.wait(10)  # the delivering thread resumes only now
        return accepted

    monkeypatch.setattr(_agent.Agent, "followup", followup_then_wait)

    taken = backend.event()

    def kid(turn: Turn) -> Any:
        if turn.index == 0:
            assert taken.wait(10)  # the test holds the agent first
            _delegate_and_settle(dispatcher, provider, turn, backend)
        else:
            dispatcher.dispose_settled(turn)  # what openai_chat's turn does first
            second_ran.set()
        return None

    kid_id = _start_kid(rt, kid)
    # Taken while its first turn waits: once its second turn ran, the child may
    # settle (and leave the registry) before this thread looks.
    agent = rt.agents.get(kid_id)
    assert agent is not None
    taken.set()
    assert second_ran.wait(10)
    assert agent.wait_disposed(20)  # it settles
    assert len(provider.disposed) == 1


def test_the_child_settles_only_after_its_delivered_run_is_disposed(
    rt: Runtime, backend: Backend
) -> None:
    """Children first: the run's result was delivered and its disposal is under way
    (held at a gate) when the turn the result started disposes settled runs. The
    run was taken off the agent's runs before its disposal, so that turn ended the
    residency hold and the child could settle before its run was disposed (a
    flaky failure of the test above). It counts until disposed now."""
    provider = ManualProvider()
    provider.delivering.release()
    disposing = Gate("disposing")
    order: list[str] = []

    def dispose(_timeout: Any) -> None:
        disposing.pass_through()
        order.append("run disposed")

    start = provider.start

    def start_held(request: Any, descriptor: Any) -> SubagentRun:
        run = start(request, descriptor)
        return SubagentRun(id=run.id, local_agent=None, result=run.result, dispose=dispose)

    provider.start = start_held  # type: ignore[method-assign]
    rt.subagents.register_provider(provider)
    dispatcher = ToolDispatcher()
    seen: list[tuple[str, ...]] = []
    second_done = backend.event()

    def kid(turn: Turn) -> Any:
        if turn.index == 0:
            _delegate_and_settle(dispatcher, provider, turn, backend)
        else:
            assert disposing.wait_reached(10)  # delivered, its disposal begun
            dispatcher.dispose_settled(turn)
            seen.append(dispatcher.background(turn))
            second_done.set()
        return None

    kid_id = _start_kid(rt, kid)
    assert second_done.wait(20)
    agent = rt.agents.get(kid_id)
    assert agent is not None
    agent.add_dispose_listener(lambda _a: order.append("child settled"))
    assert len(seen) == 1 and len(seen[0]) == 1, seen  # still counted: the hold kept
    disposing.release()
    assert agent.wait_disposed(20)
    assert wait_quiescent(rt, 20)
    assert order == ["run disposed", "child settled"]
