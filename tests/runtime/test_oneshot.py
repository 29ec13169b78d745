"""One-shot delegation through ``runtime.subagents`` (R-REG, R-ONE, R-CAP, R-DEPTH)."""

from __future__ import annotations

import pytest
from subagents.actors import (
    AbortController,
    AbortSignal,
    LocalProvider,
    RunResult,
    Runtime,
    SubagentRun,
    SubagentStartRequest,
)
from subagents.actors._kernel._future import ResultFuture
from subagents.actors.testing import Block, Gate, LifecycleProbe, ScriptedBehaviour
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    OneShotDescriptor,
    SubagentDescriptorEvent,
    SubagentError,
    TurnStart,
    delegation_depth_of,
    fold_subagent_descriptor,
)


def _req(parent, prompt="task", **kw) -> SubagentStartRequest:
    kw.setdefault("signal", AbortSignal.never())
    return SubagentStartRequest(parent=parent, prompt=prompt, **kw)


class RecordingProvider(LocalProvider):
    """A local provider that records the requests it receives."""

    def __init__(self, runtime: Runtime, name: str, capabilities=frozenset()) -> None:
        super().__init__(runtime, name)
        self.capabilities = capabilities
        self.requests: list = []

    def start(self, request, descriptor):
        self.requests.append(request)
        return super().start(request, descriptor)


class FaultyProvider(LocalProvider):
    """Fails at one named step of the start sequence (after the child may exist)."""

    def __init__(self, runtime: Runtime, fail_at: str) -> None:
        super().__init__(runtime, f"faulty-{fail_at}")
        self.fail_at = fail_at
        self.child_ids: list = []

    def _step(self, step: str) -> None:
        if step != "create":
            self.child_ids.extend(
                a.session_id for a in self._runtime.agents.list() if a.header.origin == "subagent"
            )
        if step == self.fail_at:
            raise RuntimeError(f"injected fault at {step}")


# -- registry ---------------------------------------------------------------------------


def test_register_get_list_and_remove(rt: Runtime) -> None:
    """R-REG-1, R-REG-2, R-REG-3, R-REG-4, R-REG-5, R-REG-7."""
    svc = rt.subagents
    for name in ("register_provider", "get_provider", "list", "start"):
        assert callable(getattr(svc, name))
    a, b = RecordingProvider(rt, "a"), RecordingProvider(rt, "b")
    reg_a, reg_b = svc.register_provider(a), svc.register_provider(b)
    assert svc.get_provider("a") is a and svc.get_provider("b") is b
    assert svc.list() == ["local", "fork", "a", "b"]
    parent = rt.spawn("echo")
    run = svc.start("b", _req(parent))
    assert b.requests and not a.requests
    run.dispose()
    reg_a.dispose()
    reg_a.dispose()  # idempotent
    assert svc.get_provider("a") is None and svc.get_provider("never") is None
    assert svc.list() == ["local", "fork", "b"]
    before = {x.session_id for x in rt.agents.list()}
    for name in ("a", "never"):
        with pytest.raises(SubagentError) as err:
            svc.start(name, _req(parent))
        assert err.value.code == ErrorCode.PROVIDER_NOT_FOUND
    assert {x.session_id for x in rt.agents.list()} == before
    reg_b.dispose()


def test_duplicate_provider_name_fails_loud(rt: Runtime) -> None:
    """R-REG-6: a duplicate name raises at once and changes nothing."""
    first = RecordingProvider(rt, "dup")
    rt.subagents.register_provider(first)
    with pytest.raises(SubagentError) as err:
        rt.subagents.register_provider(RecordingProvider(rt, "dup"))
    assert err.value.code == ErrorCode.PROVIDER_EXISTS
    assert rt.subagents.get_provider("dup") is first
    assert rt.subagents.list().count("dup") == 1


def test_removal_does_not_revoke_returned_runs(rt: Runtime) -> None:
    """R-REG-8, R-EVT-8: a run survives its provider's removal and reports its name."""
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    reg = rt.subagents.register_provider(RecordingProvider(rt, "temp"))
    probe = LifecycleProbe(rt)
    parent = rt.spawn("echo")
    run = rt.subagents.start("temp", _req(parent, "p", model="slow"))
    assert gate.wait_reached(10)
    reg.dispose()
    gate.release()
    assert run.result.get(10) == RunResult("p", None, "completed")
    run.dispose()
    ends = [e for e in probe.events if e.type == "subagent/end"]
    assert [e.provider for e in ends] == ["temp"]


def test_request_is_borrowed_not_copied(rt: Runtime) -> None:
    """R-REG-9: the provider receives the identical request object."""
    provider = RecordingProvider(rt, "rec")
    rt.subagents.register_provider(provider)
    request = _req(rt.spawn("echo"))
    run = rt.subagents.start("rec", request)
    assert provider.requests[0] is request
    run.dispose()


# -- validation before provider work --------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"signal": None}, ErrorCode.INVALID_ARGUMENT),
        ({"signal": "not a signal"}, ErrorCode.INVALID_ARGUMENT),
        ({"label": 3}, ErrorCode.INVALID_ARGUMENT),
        ({"max_depth": 0}, ErrorCode.INVALID_ARGUMENT),
        ({"tool_filter": "abc"}, ErrorCode.INVALID_ARGUMENT),
        ({"output_schema": {"type": 5}}, ErrorCode.INVALID_ARGUMENT),
        ({"prompt": {1, 2}}, ErrorCode.ENCODE_ERROR),
        ({"label": ""}, ErrorCode.DESCRIPTOR_INVALID),
    ],
)
def test_invalid_request_never_reaches_provider(rt: Runtime, change, code) -> None:
    """R-ONE-1, R-ONE-2: an invalid request (including no signal) raises before the
    provider's start is called."""
    provider = RecordingProvider(
        rt, "rec", frozenset({"output_schema", "depth_limit", "tool_filter", "persona"})
    )
    rt.subagents.register_provider(provider)
    parent = rt.spawn("echo")
    request = _req(parent)
    for key, value in change.items():
        setattr(request, key, value)
    with pytest.raises(SubagentError) as err:
        rt.subagents.start("rec", request)
    assert err.value.code == code
    assert provider.requests == []
    assert [a.session_id for a in rt.agents.list()] == [parent.session_id]


def test_not_a_request_and_dead_parent(rt: Runtime) -> None:
    with pytest.raises(SubagentError) as err:
        rt.subagents.start("local", {"prompt": "x"})  # type: ignore[arg-type]
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    parent = rt.spawn("echo")
    parent.dispose()
    with pytest.raises(SubagentError) as err:
        rt.subagents.start("local", _req(parent))
    assert err.value.code == ErrorCode.AGENT_DISPOSED


@pytest.mark.parametrize(
    ("field", "value", "capability"),
    [
        ("output_schema", {"type": "object"}, "output_schema"),
        ("max_depth", 2, "depth_limit"),
        ("tool_filter", ["search"], "tool_filter"),
        ("persona", "terse", "persona"),
    ],
)
def test_unsupported_capability_rejected_before_child(
    rt: Runtime, field, value, capability
) -> None:
    """R-CAP-1..R-CAP-5: a requested feature the provider lacks raises before a child exists."""
    provider = RecordingProvider(rt, "bare")
    rt.subagents.register_provider(provider)
    parent = rt.spawn("echo")
    with pytest.raises(SubagentError) as err:
        rt.subagents.start("bare", _req(parent, **{field: value}))
    assert err.value.code == ErrorCode.CAPABILITY_UNSUPPORTED
    assert capability in err.value.hint
    assert provider.requests == []
    assert len(rt.agents.list()) == 1
    assert provider.capabilities <= frozenset(
        {"output_schema", "depth_limit", "tool_filter", "persona"}
    )


def test_no_capabilities_needed_for_plain_request(rt: Runtime) -> None:
    """R-CAP-6, R-ONE-10: a plain request, even selecting a model, needs no capability."""
    rt.models.register("upper", lambda _o: lambda t: str(t.content).upper())
    rt.subagents.register_provider(RecordingProvider(rt, "bare"))
    run = rt.subagents.start("bare", _req(rt.spawn("echo"), "abc", model="upper"))
    assert run.result.get(10) == RunResult("ABC", None, "completed")
    run.dispose()


def test_unknown_model_creates_nothing(rt: Runtime) -> None:
    parent = rt.spawn("echo")
    with pytest.raises(SubagentError) as err:
        rt.subagents.start("local", _req(parent, model="nope"))
    assert err.value.code == ErrorCode.MODEL_NOT_FOUND
    assert rt.agents.list() == [parent]


# -- publication, results, disposal ---------------------------------------------------------


def test_start_publishes_real_child(rt_mem: Runtime) -> None:
    """R-ONE-3, R-ONE-14, R-ONE-15, R-ONE-16, R-ONE-17, R-DESC-1, R-ONE-6, R-DEPTH-1."""
    rt = rt_mem
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    parent = rt.spawn("echo", label="root")
    run = rt.subagents.start("local", _req(parent, "do it", model="slow", label="helper"))
    child = run.local_agent
    assert child is not None and rt.agents.get(run.id) is child
    assert run.id == child.session_id
    assert rt.sessions.live(run.id) is not None
    header = rt.sessions.header(run.id)
    assert header.parent_session == parent.session_id and header.origin == "subagent"
    assert header.delegation_depth == 1 == delegation_depth_of(child)
    assert delegation_depth_of(parent) == 0
    assert gate.wait_reached(10)
    events = [r.event for r in rt.sessions.read(run.id)]
    assert isinstance(events[0], TurnStart) and isinstance(events[1], SubagentDescriptorEvent)
    assert isinstance(events[2], MessageEvent) and events[2].content == "do it"
    assert sum(isinstance(e, SubagentDescriptorEvent) for e in events) == 1
    assert fold_subagent_descriptor(events) == OneShotDescriptor(provider="local", label="helper")
    gate.release()
    assert run.result.get(10).stop_reason == "completed"
    run.dispose()


def test_label_absent_is_not_invented(rt: Runtime) -> None:
    """R-ONE-17: without a label the descriptor carries none."""
    run = rt.subagents.start("local", _req(rt.spawn("echo")))
    run.result.get(10)
    events = [r.event for r in rt.sessions.read(run.id)]
    assert fold_subagent_descriptor(events) == OneShotDescriptor(provider="local", label=None)
    run.dispose()


def test_descriptor_is_detached_from_later_request_changes(rt: Runtime) -> None:
    """R-ONE-2: changing the request after start does not change the descriptor."""
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    request = _req(rt.spawn("echo"), model="slow", label="before")
    run = rt.subagents.start("local", request)
    request.label = "after"
    gate.release()
    run.result.get(10)
    events = [r.event for r in rt.sessions.read(run.id)]
    assert fold_subagent_descriptor(events).label == "before"
    run.dispose()


def test_result_is_final_turn_output(rt: Runtime) -> None:
    """R-ONE-7: result is RunResult(output, structured, stop_reason)."""
    run = rt.subagents.start("local", _req(rt.spawn("echo"), "hello"))
    result = run.result.get(10)
    assert result == RunResult("hello", None, "completed")
    assert isinstance(result, tuple) and result.output == "hello"
    assert not hasattr(run, "followup") and not hasattr(run, "resume")
    run.dispose()


def test_child_failure_resolves_not_completed(rt: Runtime) -> None:
    """R-ONE-5, R-ONE-8: a child fault settles through the result, start does not raise."""
    rt.models.register("bad", lambda _o: lambda t: 1 / 0)
    run = rt.subagents.start("local", _req(rt.spawn("echo"), model="bad"))
    assert run.result.get(10).stop_reason == "failed"
    run.dispose()


def test_output_schema_enforced(rt: Runtime) -> None:
    """R-ONE-9: structured output is validated; a violating result is not 'completed'."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    rt.models.register("good", lambda _o: lambda t: {"n": 3})
    rt.models.register("bad", lambda _o: lambda t: {"n": "three"})
    parent = rt.spawn("echo")
    ok = rt.subagents.start("local", _req(parent, model="good", output_schema=schema))
    assert ok.result.get(10) == RunResult({"n": 3}, {"n": 3}, "completed")
    bad = rt.subagents.start("local", _req(parent, model="bad", output_schema=schema))
    result = bad.result.get(10)
    assert result.stop_reason == "failed" and result.structured is None
    ok.dispose()
    bad.dispose()


def test_dispose_cancels_waits_and_is_idempotent(rt: Runtime, run_in, backend) -> None:
    """R-ONE-11, R-ONE-12: dispose cancels remaining work, waits for settlement and
    quiescence; repeated and concurrent calls are harmless."""
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    run = rt.subagents.start("local", _req(rt.spawn("echo"), model="slow"))
    assert gate.wait_reached(10)
    tasks = [backend.spawn(run.dispose) for _ in range(3)]
    run.dispose()
    assert all(t.join(10) for t in tasks)
    assert run.result.done() and run.result.get(0).stop_reason == "cancelled"
    assert run.local_agent.disposed and rt.agents.get(run.id) is None
    run.dispose()


def test_dispose_before_first_turn_settles_result(rt: Runtime) -> None:
    """R-ONE-11: disposing at once still settles the result (never hangs)."""
    for _ in range(20):
        run = rt.subagents.start("local", _req(rt.spawn("echo")))
        run.dispose()
        assert run.result.get(0).stop_reason in {"completed", "cancelled"}


def test_abort_after_publication_cancels_work_keeps_id(rt: Runtime) -> None:
    """R-ONE-20: aborting after start returned cancels the turn; the id stays valid."""
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    controller = AbortController()
    run = rt.subagents.start(
        "local", _req(rt.spawn("echo"), model="slow", signal=controller.signal)
    )
    assert gate.wait_reached(10)
    controller.abort("user stop")
    assert run.result.get(10).stop_reason == "cancelled"
    assert rt.sessions.read(run.id)  # still inspectable
    run.dispose()


def test_abort_before_start_raises_cancelled_with_nothing_left(rt_mem: Runtime) -> None:
    """R-ONE-19, R-ERR-6: an already-aborted signal makes start raise CANCELLED."""
    rt = rt_mem
    parent = rt.spawn("echo")
    probe = LifecycleProbe(rt)
    with pytest.raises(SubagentError) as err:
        rt.subagents.start("local", _req(parent, signal=AbortSignal.aborted_with("no")))
    assert err.value.code == ErrorCode.CANCELLED
    assert rt.agents.list() == [parent] and probe.events == []


@pytest.mark.parametrize("fail_at", ["create", "published", "delivered", "return"])
def test_provider_failure_at_each_step_leaves_nothing(rt_mem: Runtime, fail_at: str) -> None:
    """R-ONE-4, R-EVT-5: a provider failing at any step leaves no session (live or
    persisted), no registered agent, no running turn, and no lifecycle event."""
    rt = rt_mem
    provider = FaultyProvider(rt, fail_at)
    rt.subagents.register_provider(provider)
    parent = rt.spawn("echo")
    probe = LifecycleProbe(rt)
    with pytest.raises(RuntimeError, match="injected"):
        rt.subagents.start(provider.name, _req(parent))
    rt.sessions.flush()
    assert rt.agents.list() == [parent]
    assert rt.sessions.live_ids() == [parent.session_id]
    for child_id in provider.child_ids:
        assert rt.store.header(child_id) is None
        assert rt.sessions.header(child_id) is None
    assert [h.id for h in rt.store.all_headers()] == [parent.session_id]
    assert probe.events == []


def test_abort_race_before_or_after_publication(rt_mem: Runtime, backend) -> None:
    """R-ONE-19/R-ONE-20 race: whenever the abort lands, either start raises CANCELLED
    with nothing left, or it returns a run whose result is not lost."""
    rt = rt_mem
    parent = rt.spawn("echo")
    raised = returned = 0
    for _ in range(40):
        controller = AbortController()
        task = backend.spawn(controller.abort, "race")
        try:
            run = rt.subagents.start("local", _req(parent, signal=controller.signal))
        except SubagentError as exc:
            assert exc.code == ErrorCode.CANCELLED
            raised += 1
        else:
            returned += 1
            assert run.result.get(10).stop_reason in {"completed", "cancelled"}
            run.dispose()
        assert task.join(10)
        assert rt.agents.list() == [parent]
    assert raised + returned == 40


# -- depth ----------------------------------------------------------------------------------


def test_max_depth_caps_descendants(rt: Runtime) -> None:
    """R-DEPTH-5, R-DEPTH-4: with max_depth=2 the child may delegate once more, the
    grandchild may not."""
    outcomes: list = []

    def grandchild(turn):
        try:
            turn.subagents.delegate("local", "deeper", model="echo")
        except SubagentError as exc:
            outcomes.append(("grandchild", exc.code))
            return "refused"
        outcomes.append(("grandchild", "ok"))
        return "delegated"

    def child(turn):
        result = turn.subagents.delegate("local", "go", model="gc")
        outcomes.append(("child", result.output))
        return result.output

    rt.models.register("gc", lambda _o: grandchild)
    rt.models.register("child", lambda _o: child)
    run = rt.subagents.start("local", _req(rt.spawn("echo"), model="child", max_depth=2))
    assert run.result.get(10).output == "refused"
    run.dispose()
    assert outcomes == [("grandchild", ErrorCode.DEPTH_EXCEEDED), ("child", "refused")]


def test_delegation_depth_counts_levels(rt: Runtime) -> None:
    """R-DEPTH-1: depth is 0 at top level and parent + 1 below."""
    depths: list[int] = []

    def level(turn):
        depths.append(delegation_depth_of(turn.agent))
        if turn.content > 0:
            turn.subagents.delegate("local", turn.content - 1)
        return

    rt.models.register("level", lambda _o: level)
    top = rt.spawn("level")
    top.followup(3)
    assert top.wait_idle(10)
    assert depths == [0, 1, 2, 3]


# -- providers ------------------------------------------------------------------------------


def test_fork_child_sees_completed_parent_history(rt: Runtime) -> None:
    """R-CAP-11: fork seeds the child with the parent's completed history; local does not."""
    seen: dict[str, list] = {}

    def child(turn):
        seen[turn.content] = [e.content for e in turn.history if isinstance(e, MessageEvent)]
        return

    def parent_behaviour(turn):
        if turn.index == 1:
            turn.subagents.delegate("fork", "forked", model="child")
            turn.subagents.delegate("local", "spawned", model="child")
        return turn.content

    rt.models.register("child", lambda _o: child)
    parent = rt.spawn(parent_behaviour)
    parent.followup("earlier")
    parent.followup("now")
    assert parent.wait_idle(10)
    assert seen == {"forked": ["earlier"], "spawned": []}
    assert rt.subagents.get_provider("fork").inherits_parent_context is True
    assert rt.subagents.get_provider("local").inherits_parent_context is False


def test_persona_and_tool_filter_apply(rt: Runtime) -> None:
    """Capabilities: persona and tool filter reach the child."""
    rt.tools.register("search", lambda turn, q: f"found {q}")
    rt.tools.register("delete", lambda turn: "deleted")
    seen = {}

    def child(turn):
        seen["persona"] = turn.persona
        seen["tools"] = turn.tools
        seen["search"] = turn.call_tool("search", "x")
        try:
            turn.call_tool("delete")
        except SubagentError as exc:
            seen["delete"] = exc.code
        return

    rt.models.register("child", lambda _o: child)
    run = rt.subagents.start(
        "local", _req(rt.spawn("echo"), model="child", persona="terse", tool_filter=["search"])
    )
    run.result.get(10)
    run.dispose()
    assert seen == {
        "persona": "terse",
        "tools": ("search",),
        "search": "found x",
        "delete": ErrorCode.UNAUTHORIZED,
    }


def test_run_type(rt: Runtime) -> None:
    run = rt.subagents.start("local", _req(rt.spawn("echo")))
    assert isinstance(run, SubagentRun)
    run.result.get(10)
    run.dispose()


def test_capability_ids_named() -> None:
    """R-CAP-2, R-CAP-3, R-CAP-4: covered by
    ``test_unsupported_capability_rejected_before_child`` (output_schema, max_depth,
    tool_filter, persona against a provider without them); this test pins the
    mapping from request field to capability name that it relies on."""
    from subagents.actors._children._oneshot import _requested_capabilities

    parent = object()
    request = SubagentStartRequest(
        parent=parent,  # type: ignore[arg-type]
        prompt="p",
        signal=AbortSignal.never(),
        output_schema={"type": "object"},
        max_depth=1,
        tool_filter=["t"],
        persona="x",
    )
    assert _requested_capabilities(request) == {
        "output_schema",
        "depth_limit",
        "tool_filter",
        "persona",
    }


class RejectingProvider(LocalProvider):
    """A provider whose run's result is rejected by an infrastructure fault."""

    def start(self, request, descriptor):
        run = super().start(request, descriptor)
        run.result.wait(10)
        fault = ResultFuture()
        fault.set_exception(RuntimeError("transport lost"))
        return SubagentRun(
            id=run.id, local_agent=run.local_agent, result=fault, dispose=run._dispose
        )


def test_rejected_result_stays_on_result(rt: Runtime) -> None:
    """R-ONE-13: a rejected result stays on ``result``; ``dispose()`` does not re-raise it."""
    rt.subagents.register_provider(RejectingProvider(rt, "rejecting"))
    run = rt.subagents.start("rejecting", _req(rt.spawn("echo")))
    with pytest.raises(RuntimeError, match="transport lost"):
        run.result.get(5)
    run.dispose()  # releases the child without raising the result's error
    assert run.local_agent.disposed
    with pytest.raises(RuntimeError, match="transport lost"):
        run.result.get(0)


def test_descriptor_is_log_only(rt_mem: Runtime) -> None:
    """R-DESC-7: the descriptor is in the log but absent from the model history a
    behaviour sees: a fork grandchild whose seed (its continuable parent's completed
    history) starts with that parent's descriptor."""
    from subagents.actors import ContinuableStartSpec

    rt = rt_mem
    seen: list[str] = []
    runs: list = []

    def leaf(turn):
        seen.extend(type(e).__name__ for e in turn.history)
        return

    def middle(turn):
        if turn.index == 1:  # turn 0 has completed: the fork seed holds it
            run = turn.subagents.start("fork", "deeper", model="leaf")
            runs.append(run.id)
            run.result.get(10)
            run.dispose()
        return

    rt.models.register("leaf", lambda _o: leaf)
    rt.models.register("middle", lambda _o: middle)
    top = rt.spawn("echo")
    child_id, _ = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=top, provider="local", prompt="p", label="mid", model="middle")
    )
    rt.subagents.followup(top, child_id, "fork now")
    assert rt.wait_idle(10)
    rt.sessions.flush()
    assert "TurnEnd" in seen
    assert "SubagentDescriptorEvent" not in seen
    logged = [type(r.event).__name__ for r in rt.sessions.read(runs[0])]
    assert logged.count("SubagentDescriptorEvent") == 2  # the seed's and its own


def test_runaway_recursive_delegation_stops_at_the_runtime_ceiling(backend) -> None:  # type: ignore[no-untyped-def]
    """R-DEPTH-4 (runtime ceiling): a behaviour delegating to its own model stops at
    ``max_delegation_depth`` with DEPTH_EXCEEDED instead of recursing for ever."""
    depths: list[int] = []

    def recurse(turn):
        depths.append(delegation_depth_of(turn.agent))
        try:
            return turn.subagents.delegate("local", "again").output
        except SubagentError as exc:
            return exc.code

    with Runtime(backend=backend, max_delegation_depth=5) as rt:
        rt.models.register("recurse", lambda _o: recurse)
        top = rt.spawn("recurse")
        top.followup("go")
        assert top.wait_idle(30)
        assert depths == [0, 1, 2, 3, 4, 5]
        assert rt.sessions.read(top.session_id)[-1].event.output == ErrorCode.DEPTH_EXCEEDED
    with pytest.raises(SubagentError) as err:
        Runtime(backend=backend, max_delegation_depth=0)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
