"""Tool names a model is shown match what the OpenAI API accepts
(``^[a-zA-Z0-9_-]{1,64}$``; it answers any other with a 400 that fails every turn):
a ``ToolDispatcher`` refuses an extra tool so named and ``runtime.tools.register``
refuses a runtime tool so named (``INVALID_ARGUMENT``, naming the rule); a tool
a setup contribution put in a child's scope under such a name is left out of
what the model sees, with a warning, and a call to it is refused like any
unknown tool. R-ERR-1."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from model_kit import register
from subagents.actors import ContinuableStartSpec, ModelTool, Runtime, ToolDispatcher
from subagents.actors._agents._tools import TOOL_NAME_PATTERN
from subagents.actors._model import _schemas
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI
from subagents.protocol import ErrorCode, SubagentError

BAD_NAMES = ["search.web", "two words", "x" * 65, "caf\u00e9"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=["dot", "space", "65 chars", "non-ASCII"])
def test_an_extra_tool_with_a_name_the_api_refuses_is_refused(name: str) -> None:
    tool = ModelTool("x", {"type": "object"}, print)
    with pytest.raises(SubagentError) as err:
        ToolDispatcher(extra={name: tool})
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert "^[a-zA-Z0-9_-]{1,64}$" in str(err.value)


def test_extra_tool_names_the_api_accepts_pass() -> None:
    tool = ModelTool("x", {"type": "object"}, print)
    ToolDispatcher(extra={"search_web-2": tool, "y" * 64: tool})


@pytest.mark.parametrize("name", BAD_NAMES, ids=["dot", "space", "65 chars", "non-ASCII"])
def test_a_runtime_tool_with_a_name_the_api_refuses_is_refused(rt: Runtime, name: str) -> None:
    """At registration, not at every later request (where the model layer could
    only leave it out); nothing is registered."""
    with pytest.raises(SubagentError) as err:
        rt.tools.register(name, lambda turn: None)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert "^[a-zA-Z0-9_-]{1,64}$" in str(err.value)
    assert name not in rt.tools.visible(None, {})


def test_runtime_tool_names_the_api_accepts_pass(rt: Runtime) -> None:
    for name in ("search_web-2", "y" * 64, "Z", "0"):
        rt.tools.register(name, lambda turn: None)
    assert rt.tools.visible(None, {}) == ("search_web-2", "y" * 64, "Z", "0")


def test_one_rule_for_every_tool_name() -> None:
    """The model layer checks names by the registry's rule (one definition)."""
    assert _schemas.TOOL_NAME_PATTERN is TOOL_NAME_PATTERN


def test_a_scope_tool_with_a_name_the_api_refuses_is_not_shown(
    rt: Runtime, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    def tools(scope: Any) -> None:
        scope.add_tool("search.web", lambda turn, q: ran.append(q) or "found")
        scope.add_tool("search_web", lambda turn, q: ran.append("ok " + q) or "found")

    rt.subagents.register_continuable_setup(tools)
    # One dispatcher for both turns: the child may settle between them, and a
    # dispatcher of its own would be a new one at its next activation.
    register(rt, fake, max_retries=0, tools=ToolDispatcher())
    fake.script(
        Answer(tool_calls=[FakeCall("search.web", {"q": "a"}), FakeCall("search_web", {"q": "b"})]),
        Answer(content="done"),
        Answer(content="again"),
    )
    parent = rt.spawn("echo")
    spec = ContinuableStartSpec(
        parent=parent, provider="local", prompt="go", label="c", model="planner"
    )
    with caplog.at_level(logging.WARNING, logger="subagents"):
        child_id, _ = rt.subagents.start_continuable(spec)
        assert rt.wait_idle(20)
        rt.subagents.followup(parent, child_id, "go on")
        assert rt.wait_idle(20)
    assert [e.output for e in rt.sessions.turn_ends(child_id)] == ["done", "again"]
    first = fake.requests[0]
    assert "search.web" not in first.tool_names and "search_web" in first.tool_names
    assert ran == ["ok b"]
    refused = json.loads(fake.requests[1].messages[-2]["content"])
    assert refused["error"]["code"] == ErrorCode.INVALID_ARGUMENT
    warned = [r for r in caplog.records if "search.web" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]  # once, not every turn


@pytest.mark.parametrize(
    "name", ["functions.list_agents", "", "two words"], ids=["dot", "empty", "space"]
)
def test_a_call_to_a_name_the_api_refuses_is_told_to_the_model(
    rt: Runtime, fake: FakeOpenAI, name: str
) -> None:
    """A model calling a tool by a name the API does not take (a hallucinated
    ``functions.`` prefix, a name left out, a space) gets a tool error naming it;
    its call goes back to the API in the next request under a name the API takes
    (the fake refuses any other with a 400, as the real API does -- which failed the
    turn), and the turn goes on. R-ERR-1."""
    register(rt, fake, max_retries=0)
    fake.script(
        Answer(tool_calls=[FakeCall(name, {}), FakeCall("list_agents", {})]),
        Answer(content="done"),
    )
    agent = rt.spawn("planner")
    agent.followup("go")
    assert agent.wait_idle(20)
    end = rt.sessions.turn_ends(agent.session_id)[-1]
    assert (end.stop_reason, end.output) == ("completed", "done"), end.error
    second = fake.requests[1].messages
    refused = json.loads(second[-2]["content"])
    assert refused["error"]["code"] == ErrorCode.INVALID_ARGUMENT
    assert repr(name) in refused["error"]["message"]
    assert "agents" in json.loads(second[-1]["content"])  # the other call ran
    called = [c["function"]["name"] for c in second[-3]["tool_calls"]]
    assert called[1] == "list_agents" and called[0] != name
