"""Tool names a model is shown match what the OpenAI API accepts
(``^[a-zA-Z0-9_-]{1,64}$``; it answers any other with a 400 that fails every turn):
a ``ToolDispatcher`` refuses an extra tool so named (``INVALID_ARGUMENT``); a
runtime tool so named is left out of what the model sees, with a warning, and
a call to it is refused like any unknown tool. R-ERR-1."""

from __future__ import annotations

import json
import logging

import pytest
from model_kit import register, run_turn
from subagents.actors import ModelTool, Runtime, ToolDispatcher
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


def test_a_runtime_tool_with_a_name_the_api_refuses_is_not_shown(
    rt: Runtime, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []
    rt.tools.register("search.web", lambda turn, q: ran.append(q) or "found")
    rt.tools.register("search_web", lambda turn, q: ran.append("ok " + q) or "found")
    register(rt, fake, max_retries=0)
    fake.script(
        Answer(tool_calls=[FakeCall("search.web", {"q": "a"}), FakeCall("search_web", {"q": "b"})]),
        Answer(content="done"),
        Answer(content="again"),
    )
    agent = rt.spawn("planner")
    with caplog.at_level(logging.WARNING, logger="subagents"):
        assert run_turn(rt, agent, "go").output == "done"
        assert run_turn(rt, agent, "go on").output == "again"
    first = fake.requests[0]
    assert "search.web" not in first.tool_names and "search_web" in first.tool_names
    assert ran == ["ok b"]
    refused = json.loads(fake.requests[1].messages[-2]["content"])
    assert refused["error"]["code"] == ErrorCode.INVALID_ARGUMENT
    warned = [r for r in caplog.records if "search.web" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]  # once, not every turn
