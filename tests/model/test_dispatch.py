"""The model-facing subagent tools and their dispatcher (issue 16 point 1; R-FUP-2,
R-INT-6, R-REP-2, R-CAP-4/5, R-SETUP-7, R-LIST-1/18/19): JSON-schema definitions,
arguments validated against them, every authority rule of the service unchanged, a
refused call returned as a tool result with its error code, tool filter and persona."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from subagents.actors import (
    SUBAGENT_TOOLS,
    AbortController,
    AgentOptions,
    ContinuableStartSpec,
    ModelTool,
    Runtime,
    ToolDispatcher,
    Turn,
)
from subagents.actors.testing import Block, Gate, ScriptedBehaviour, wait_quiescent
from subagents.protocol import (
    ErrorCode,
    MessageSource,
    SubagentError,
    snapshot_subagent_descriptor,
)
from subagents.protocol._descriptor import MAX_LABEL_LEN

Calls = list[tuple[str, Any]]


def _caller(
    rt: Runtime, dispatcher: ToolDispatcher, name: str = "caller"
) -> tuple[list[Any], Callable[[int], bool]]:
    """Register model ``name``: each turn's content is a list of (tool, arguments) to
    dispatch; each turn's results go to the returned list, and ``wait_turns(n)``
    waits (on either backend) until ``n`` turns ran."""
    seen: list[Any] = []
    ran = [AbortController() for _ in range(64)]

    def behaviour(turn: Turn) -> Any:
        if isinstance(turn.content, list):
            results = [dispatcher.dispatch(turn, n, a) for n, a in turn.content]
        else:
            results = turn.content
        seen.append(results)
        ran[len(seen) - 1].abort("ran")
        return "ok"

    rt.models.register(name, lambda _o: behaviour)
    return seen, lambda n: ran[n - 1].signal.wait(10)


def _run(rt: Runtime, agent: Any, calls: Calls, seen: list[Any]) -> list[Any]:
    before = len(seen)
    agent.followup(calls)
    assert agent.wait_idle(10)
    assert len(seen) == before + 1
    return list(seen[-1])


def test_definitions_are_valid_json_schema_function_tools() -> None:
    assert list(SUBAGENT_TOOLS) == [
        "delegate",
        "start_agent",
        "send_message",
        "interrupt",
        "report",
        "list_agents",
    ]
    for tool in SUBAGENT_TOOLS.values():
        jsonschema.Draft202012Validator.check_schema(tool.parameters)
        assert tool.parameters["type"] == "object"
        assert tool.description


@pytest.mark.parametrize("tool", ["delegate", "start_agent"])
def test_a_name_the_schema_takes_is_one_the_descriptor_takes(tool: str) -> None:
    """A label, model or provider the schema lets through must not be refused by
    the start's descriptor (a 201-character label was: the schema said 256)."""
    schema = SUBAGENT_TOOLS[tool].parameters
    validator = jsonschema.Draft202012Validator(schema)

    def descriptor_takes(field: str, value: str) -> bool:
        record: dict[str, Any] = {
            "mode": "continuable",
            "provider": "local",
            "label": "l",
            "agent_options": {"provider": "local", "model": "m"},
        }
        if field == "label":
            record["label"] = value
        else:
            record["agent_options"] = {**record["agent_options"], field: value}
        try:
            snapshot_subagent_descriptor(record)
        except SubagentError:
            return False
        return True

    for field in ("label", "model", "provider"):
        for value in ("x", "L" * MAX_LABEL_LEN, "L" * (MAX_LABEL_LEN + 1), "   ", ""):
            call = {"prompt": "p", "label": "l", field: value}
            assert validator.is_valid(call) == descriptor_takes(field, value), (field, value)


def test_filter_and_parent_decide_what_an_agent_sees(rt: Runtime) -> None:
    """A top-level agent is not shown ``report``; a tool filter hides the rest."""
    dispatcher = ToolDispatcher()
    shown: list[list[str]] = []

    def behaviour(turn: Turn) -> Any:
        shown.append([d["function"]["name"] for d in dispatcher.definitions(turn)])
        return "ok"

    rt.models.register("look", lambda _o: behaviour)
    top = rt.spawn("look")
    top.followup("x")
    assert top.wait_idle(10)
    assert shown[-1] == ["delegate", "start_agent", "send_message", "interrupt", "list_agents"]
    narrow = rt.spawn(
        "look", options=AgentOptions(tool_filter=("delegate", "report", "list_agents"))
    )
    narrow.followup("x")
    assert narrow.wait_idle(10)
    assert shown[-1] == ["delegate", "list_agents"]
    child = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=top, provider="local", prompt="x", label="c", model="look")
    )
    assert child.child_id
    assert wait_quiescent(rt)
    assert shown[-1] == [
        "delegate",
        "start_agent",
        "send_message",
        "interrupt",
        "report",
        "list_agents",
    ]


def test_refusals_come_back_as_tool_results(rt: Runtime) -> None:
    dispatcher = ToolDispatcher()
    seen, _ = _caller(rt, dispatcher)
    agent = rt.spawn(
        "caller", options=AgentOptions(tool_filter=("delegate", "send_message", "interrupt"))
    )
    gate = Gate("someone else's child")
    rt.models.register("held", lambda _o: ScriptedBehaviour([Block(gate)]))
    other = rt.spawn("echo")
    foreign = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=other, provider="local", prompt="x", label="f", model="held")
    ).child_id
    assert gate.wait_reached(10)  # resident: the interrupt's authority is checked
    results = _run(
        rt,
        agent,
        [
            ("delegate", '{"prompt": '),  # invalid JSON
            ("delegate", {"prompt": 3}),  # schema: not a string
            ("delegate", {"prompt": "x", "colour": "red"}),  # schema: extra property
            ("start_agent", {"prompt": "x", "label": "l"}),  # filtered out
            ("no_such_tool", {}),
            ("send_message", {"id": str(foreign), "content": "hi"}),  # not its child
            ("interrupt", {"id": str(foreign)}),  # not its descendant
            ("delegate", {"prompt": "x", "provider": "nowhere"}),
            ("delegate", {"prompt": "x", "model": "no-such-model"}),
            ("send_message", {"id": "not-an-id", "content": "hi"}),
        ],
        seen,
    )
    codes = [r["error"]["code"] for r in results]
    assert codes == [
        ErrorCode.INVALID_ARGUMENT,
        ErrorCode.INVALID_ARGUMENT,
        ErrorCode.INVALID_ARGUMENT,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.INVALID_ARGUMENT,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.PROVIDER_NOT_FOUND,
        ErrorCode.MODEL_NOT_FOUND,
        ErrorCode.INVALID_ARGUMENT,
    ]
    assert "not valid JSON" in results[0]["error"]["message"]
    assert "prompt" in results[1]["error"]["message"]
    assert all(isinstance(r["error"]["message"], str) for r in results)
    # The turn ended normally: a refusal never ends it.
    assert rt.sessions.turn_ends(agent.session_id)[-1].stop_reason == "completed"
    gate.release()


def test_report_is_refused_to_a_one_shot_child(rt: Runtime) -> None:
    """R-REP-2 unchanged: a one-shot child has a parent but cannot report."""
    dispatcher = ToolDispatcher()
    seen, _ = _caller(rt, dispatcher)
    rt.models.register(
        "boss",
        lambda _o: (
            lambda turn: turn.subagents.delegate(
                "local", [("report", {"content": "hi"})], model="caller"
            )
        ),
    )
    parent = rt.spawn("boss")
    parent.followup("go")
    assert parent.wait_idle(10)
    assert rt.sessions.turn_ends(parent.session_id)[-1].stop_reason == "completed"
    assert seen[0][0]["error"]["code"] == ErrorCode.UNAUTHORIZED


def test_delegate_waits_and_passes_persona_and_tools(rt: Runtime) -> None:
    dispatcher = ToolDispatcher()
    seen, _ = _caller(rt, dispatcher)
    options: list[Any] = []

    def child(turn: Turn) -> Any:
        options.append((turn.persona, turn.agent.options.tool_filter))
        return f"did {turn.content}"

    rt.models.register("child", lambda _o: child)
    agent = rt.spawn("caller", options=AgentOptions(tool_filter=("delegate", "list_agents")))
    args = {
        "prompt": "sum",
        "model": "child",
        "persona": "You add numbers.",
        "tools": ["list_agents", "start_agent"],
        "label": "adder",
    }
    (result,) = _run(rt, agent, [("delegate", args)], seen)
    assert result["stop_reason"] == "completed" and result["output"] == "did sum"
    # The service narrows the child's filter to the parent's: never more tools.
    assert options == [("You add numbers.", ("list_agents",))]


def test_delegate_in_the_background_delivers_its_result_as_a_message(rt: Runtime) -> None:
    dispatcher = ToolDispatcher()
    seen, wait_turns = _caller(rt, dispatcher)
    gate = Gate("background child")
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    agent = rt.spawn("caller")
    (started,) = _run(
        rt, agent, [("delegate", {"prompt": "p", "model": "slow", "background": True})], seen
    )
    assert started["status"] == "running"
    assert gate.wait_reached(10)
    gate.release()
    # The result arrives as the agent's next turn, from the run's id as a child.
    assert wait_turns(2) and agent.wait_idle(10)
    events = [r.event for r in rt.sessions.read(agent.session_id)]
    delivered = [e for e in events if getattr(e, "content", None) and isinstance(e.content, dict)]
    assert delivered, events
    result = delivered[-1].content["delegate_result"]
    assert result["id"] == started["id"] and result["stop_reason"] == "completed"
    assert delivered[-1].source == MessageSource(kind="child", session_id=started["id"])
    # Settled runs are disposed on the dispatcher's next call for the agent.
    _run(rt, agent, [("list_agents", {})], seen)
    assert seen[-1][0]["agents"][0]["id"] == started["id"]


def _background_kid(rt: Runtime) -> tuple[Any, Gate, list[Any], list[Any]]:
    """A host and its continuable child ``kid`` whose first turn delegates to the
    gated ``slow`` model in the background; the kid's later turns record what they
    were given. Returns the host, the gate, the run the kid started, and its turns."""
    dispatcher = ToolDispatcher()
    gate = Gate("background child")
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    started: list[Any] = []
    contents: list[Any] = []

    def kid(turn: Turn) -> Any:
        contents.append(turn.content)
        if turn.index == 0:
            call = {"prompt": "p", "model": "slow", "background": True}
            started.append(dispatcher.dispatch(turn, "delegate", call))
        else:
            dispatcher.dispose_settled(turn)
        return "asked"

    rt.models.register("kid", lambda _o: kid)
    host = rt.spawn("echo", label="host")
    rt.subagents.start_continuable(
        ContinuableStartSpec(parent=host, provider="local", prompt="go", label="kid", model="kid")
    )
    assert gate.wait_reached(10)
    return host, gate, started, contents


def test_a_continuable_child_stays_resident_for_its_background_result(rt: Runtime) -> None:
    """R-RES (waiting while it owns an undisposed child): a continuable child that
    delegates in the background does not settle when its turn ends -- it would
    cancel the run -- but waits, resident, for the result, which starts its next
    turn; then the run is disposed and the child settles. (It settled at once, the
    run was cancelled and its agent stayed live until the runtime closed.)"""
    host, gate, started, contents = _background_kid(rt)
    (run,) = started
    kid = rt.agents.get(rt.subagents.list_children(host.session_id).rows[0].id)
    assert kid is not None and kid.wait_idle(10)
    assert rt.continuation.activation(kid.session_id) is not None  # held, not settled
    gate.release()
    assert wait_quiescent(rt, 20)
    result = contents[1]["delegate_result"]
    assert (result["id"], result["stop_reason"]) == (run["id"], "completed")
    assert kid.wait_disposed(20)  # settled once the result was taken
    assert [a.label for a in rt.agents.list()] == ["host"]


def test_a_quick_background_result_always_reaches_its_continuable_child(rt: Runtime) -> None:
    """The race behind the test above, many times: a background run that ends at
    once races the child's settling after the turn that started it. Every result
    is delivered as the child's next turn, every run is disposed, and every child
    settles (without the hold, a run that lost the race was cancelled)."""
    dispatcher = ToolDispatcher()
    delivered: list[Any] = []

    def kid(turn: Turn) -> Any:
        if turn.index == 0:
            dispatcher.dispatch(
                turn, "delegate", {"prompt": "p", "model": "echo", "background": True}
            )
        else:
            delivered.append(turn.content["delegate_result"]["stop_reason"])
            dispatcher.dispose_settled(turn)
        return None

    rt.models.register("kid", lambda _o: kid)
    host = rt.spawn("echo", label="host")
    kids = [
        rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=host, provider="local", prompt="go", label=f"kid{i}", model="kid"
            )
        ).child_id
        for i in range(30)
    ]
    assert wait_quiescent(rt, 30)
    for kid_id in kids:  # settling follows idleness
        agent = rt.agents.get(kid_id)
        assert agent is None or agent.wait_disposed(20)
    assert delivered == ["completed"] * 30
    assert [a.label for a in rt.agents.list()] == ["host"]
    assert rt.continuation.activations() == []


def test_a_drain_cancels_a_held_child_s_background_run(rt: Runtime) -> None:
    """R-DRAIN-4/5: draining the host of a child that waits for a background run
    does not wait for the run: the drain's cancel cancels it, no result is
    delivered, the run's agent is disposed, then the child is released."""
    host, _gate, started, contents = _background_kid(rt)
    (run,) = started
    one_shot = rt.agents.get(run["id"])
    assert one_shot is not None
    rt.subagents.drain_continuable_descendants([host], timeout=20)
    assert one_shot.wait_disposed(20)
    (end,) = rt.sessions.turn_ends(run["id"])
    assert end.stop_reason == "cancelled"
    assert contents == ["go"]  # no result was delivered
    assert wait_quiescent(rt, 10)
    assert [a.label for a in rt.agents.list()] == ["host"]


def test_start_agent_send_message_interrupt_and_list(rt: Runtime) -> None:
    dispatcher = ToolDispatcher()
    seen, _ = _caller(rt, dispatcher)
    gate = Gate("grandchild")
    rt.models.register(
        "worker",
        lambda _o: ScriptedBehaviour(
            per_turn=[[], [Block(gate)]],
        ),
    )
    root = rt.spawn("caller")
    (started,) = _run(
        rt, root, [("start_agent", {"prompt": "first", "label": "w", "model": "worker"})], seen
    )
    cid = started["id"]
    assert rt.agents.get(cid) is None or rt.agents.get(cid).wait_idle(10)
    (sent,) = _run(rt, root, [("send_message", {"id": cid, "content": "second"})], seen)
    assert sent["delivered"] == "queued" and len(sent["message_id"]) == 32
    assert gate.wait_reached(10)
    listed, interrupted = _run(
        rt, root, [("list_agents", {"scope": "descendants"}), ("interrupt", {"id": cid})], seen
    )
    row = listed["agents"][0]
    assert (row["id"], row["label"], row["mode"], row["state"]) == (
        cid,
        "w",
        "continuable",
        "running",
    )
    assert row["parent_id"] == str(root.session_id) and row["depth"] == 1
    assert interrupted == {"interrupt": "accepted", "id": cid}
    child = rt.agents.get(cid)
    if child is not None:
        assert child.wait_idle(10)
    ends = rt.sessions.turn_ends(cid)
    assert [e.stop_reason for e in ends] == ["completed", "cancelled"]


def test_extra_tools_are_validated_and_their_failures_returned(rt: Runtime) -> None:
    def lookup(turn: Turn, key: str) -> Any:
        if key == "boom":
            raise RuntimeError("lookup broke")
        return {"value": key.upper()}

    tool = ModelTool(
        "Look a key up.",
        {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        lookup,
    )
    dispatcher = ToolDispatcher(tools=["list_agents"], extra={"lookup": tool})
    seen, _ = _caller(rt, dispatcher)
    agent = rt.spawn("caller")
    results = _run(
        rt,
        agent,
        [("lookup", {"key": "a"}), ("lookup", {}), ("lookup", '{"key": "boom"}'), ("delegate", {})],
        seen,
    )
    assert results[0] == {"value": "A"}
    assert results[1]["error"]["code"] == ErrorCode.INVALID_ARGUMENT
    assert results[2]["error"]["code"] == ErrorCode.INTERNAL
    assert "lookup broke" in results[2]["error"]["message"]
    assert results[3]["error"]["code"] == ErrorCode.INVALID_ARGUMENT  # not offered


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tools": ["fly"]},
        {"extra": {"delegate": ModelTool("x", {"type": "object"}, print)}},
        {"extra": {"t": ModelTool("x", {"type": "object"}, None)}},
        {"extra": {"t": ModelTool("x", {"type": 12}, print)}},
    ],
)
def test_bad_dispatcher_configuration(kwargs: dict[str, Any]) -> None:
    with pytest.raises(SubagentError) as err:
        ToolDispatcher(**kwargs)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT


def test_a_cancelled_turn_ends_instead_of_returning_a_result(rt: Runtime) -> None:
    dispatcher = ToolDispatcher()
    gate = Gate("child")
    rt.models.register("blocked", lambda _o: ScriptedBehaviour([Block(gate)]))
    outcome: list[Any] = []

    def behaviour(turn: Turn) -> Any:
        outcome.append(dispatcher.dispatch(turn, "delegate", {"prompt": "p", "model": "blocked"}))
        return "not reached"

    rt.models.register("boss", lambda _o: behaviour)
    agent = rt.spawn("boss")
    agent.followup("go")
    assert gate.wait_reached(10)
    agent.cancel("stop")
    assert agent.wait_idle(10)
    end = rt.sessions.turn_ends(agent.session_id)[-1]
    assert end.stop_reason == "cancelled"
