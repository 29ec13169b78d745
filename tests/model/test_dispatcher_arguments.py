"""A ``ToolDispatcher`` refuses at construction what would fail later -- every
request of every turn (a description or schema the model API cannot take), or
every ``delegate`` call (a wait no result future takes) -- with
``INVALID_ARGUMENT``, never an ``AttributeError`` or ``TypeError``; and a model
calling a tool nobody registered under a name the API refuses is told so, with
no warning about a runtime tool of that name; a tool that raises is logged with
its exception's type and traceback, as the model is told. R-ERR-1."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import pytest
from model_kit import register
from subagents.actors import SUBAGENT_TOOLS, ModelTool, Runtime, ToolDispatcher
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI
from subagents.protocol import ErrorCode, SubagentError


def _fn(turn: Any) -> str:
    return "ok"


OBJECT = {"type": "object", "properties": {}}

REFUSED: dict[str, dict[str, Any]] = {
    "extra not a mapping": {"extra": 5},
    "extra a list": {"extra": ["lookup"]},
    "schema None": {"extra": {"lookup": ModelTool("d", None, _fn)}},  # type: ignore[arg-type]
    "schema of an array": {"extra": {"lookup": ModelTool("d", {"type": "array"}, _fn)}},
    "schema JSON cannot carry": {
        "extra": {
            "lookup": ModelTool(
                "d", {"type": "object", "properties": {"k": {"default": object()}}}, _fn
            )
        }
    },
    "schema with NaN": {
        "extra": {"lookup": ModelTool("d", {"type": "object", "maximum": math.nan}, _fn)}
    },
    "description not a str": {"extra": {"lookup": ModelTool(5, OBJECT, _fn)}},  # type: ignore[arg-type]
    "description None": {"extra": {"lookup": ModelTool(None, OBJECT, _fn)}},  # type: ignore[arg-type]
    "delegate_timeout negative": {"delegate_timeout": -1},
    "delegate_timeout a str": {"delegate_timeout": "10"},
    "delegate_timeout NaN": {"delegate_timeout": math.nan},
    "delegate_timeout a bool": {"delegate_timeout": True},
    "runtime_tools a str": {"runtime_tools": "no"},  # truthy: it showed them
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_dispatcher_that_would_fail_later_is_refused_now(case: str) -> None:
    with pytest.raises(SubagentError) as err:
        ToolDispatcher(**REFUSED[case])
    assert err.value.code == ErrorCode.INVALID_ARGUMENT


def test_the_refusals_name_what_is_wrong_and_what_the_api_takes_passes() -> None:
    with pytest.raises(SubagentError, match=r"lookup.*object"):
        ToolDispatcher(extra={"lookup": ModelTool("d", {"type": "array"}, _fn)})
    with pytest.raises(SubagentError, match=r"lookup.*description"):
        ToolDispatcher(extra={"lookup": ModelTool(5, OBJECT, _fn)})  # type: ignore[arg-type]
    with pytest.raises(SubagentError, match="delegate_timeout"):
        ToolDispatcher(delegate_timeout=-1)
    with pytest.raises(SubagentError, match="not a str"):
        ToolDispatcher(tools="delegate")
    ToolDispatcher(extra={"lookup": ModelTool("d", {}, _fn)})  # no parameters at all
    ToolDispatcher(extra={"lookup": ModelTool("d", OBJECT, _fn)}, delegate_timeout=0.5)
    ToolDispatcher(tools=("delegate",), delegate_timeout=math.inf, extra={})


def test_a_call_to_an_unregistered_name_the_api_refuses_warns_of_no_runtime_tool(
    rt: Runtime, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """The model invents ``functions.search``: its call is refused as an unknown
    tool, and the log does not claim a runtime tool of that name exists (it said
    "runtime tool 'functions.search' is not shown to models")."""
    register(rt, fake, max_retries=0)
    fake.script(Answer(tool_calls=[FakeCall("functions.search", {})]), Answer(content="done"))
    agent = rt.spawn("planner")
    with caplog.at_level(logging.WARNING, logger="subagents"):
        agent.followup("go")
        assert agent.wait_idle(20)
    end = rt.sessions.turn_ends(agent.session_id)[-1]
    assert (end.stop_reason, end.output) == ("completed", "done"), end.error
    refused = json.loads(fake.requests[1].messages[-1]["content"])
    assert refused["error"]["code"] == ErrorCode.INVALID_ARGUMENT
    assert [r.getMessage() for r in caplog.records if "functions.search" in r.getMessage()] == []


def test_a_tool_that_raises_is_logged_with_its_type_and_traceback(
    rt: Runtime, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """A runtime tool raising ``KeyError('k')``: the model reads ``KeyError: 'k'``
    and the turn goes on; the warning names the type and carries the traceback
    (it read "raised: 'k'", and a bare ``RuntimeError()`` "raised: ")."""

    def lookup(turn: Any, key: str) -> str:
        return {}[key]  # type: ignore[no-any-return]

    rt.tools.register("lookup", lookup)
    register(rt, fake, max_retries=0)
    fake.script(Answer(tool_calls=[FakeCall("lookup", {"key": "k"})]), Answer(content="done"))
    agent = rt.spawn("planner")
    with caplog.at_level(logging.WARNING, logger="subagents"):
        agent.followup("go")
        assert agent.wait_idle(20)
    assert rt.sessions.turn_ends(agent.session_id)[-1].output == "done"
    told = json.loads(fake.requests[1].messages[-1]["content"])["error"]
    assert (told["code"], told["message"]) == (ErrorCode.INTERNAL, "the tool failed: KeyError: 'k'")
    (record,) = [r for r in caplog.records if "lookup" in r.getMessage()]
    assert "KeyError: 'k'" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_the_subagent_tools_schemas_are_checked_once_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``openai_chat(tools=True)`` makes a dispatcher per agent, at each activation:
    it checked the six constant schemas every time (some 10 ms of CPU). Now an
    extra tool's schema is checked per dispatcher, the subagent tools' once."""
    import jsonschema

    ToolDispatcher()  # whatever the process checked before
    tools = [OBJECT, *(t.parameters for t in SUBAGENT_TOOLS.values())]
    seen: list[Any] = []
    real = jsonschema.validators.validator_for

    def counting(schema: Any, *args: Any, **kwargs: Any) -> Any:
        if any(schema is t for t in tools):  # a tool's, not the metaschema's parts
            seen.append(schema)
        return real(schema, *args, **kwargs)

    monkeypatch.setattr(jsonschema.validators, "validator_for", counting)
    for _ in range(3):
        ToolDispatcher()
    assert seen == []
    ToolDispatcher(extra={"lookup": ModelTool("d", OBJECT, _fn)})
    assert seen == [OBJECT]
