"""A tool whose returned value cannot be rendered as the text of its ``tool``
message -- its ``__str__`` raises, its JSON encoding raises, it is nested deeper
than the encoder recurses -- comes back to the model as an ``{"error": ...}``
tool result (code ``INTERNAL``, the exception's type and message), as a tool that
raises does, and the turn goes on; it failed the whole turn with a raw
``RuntimeError`` or ``RecursionError``. Over real HTTP on both backends. R-ERR-1
(typed errors at a boundary; the dispatcher contains a tool's failure)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from model_kit import register, run_turn
from subagents.actors import Runtime
from subagents.actors._model._history import tool_text
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI


class _Opaque:
    """A value whose ``str()`` fails, as a proxy to a closed resource's does."""

    def __str__(self) -> str:
        raise RuntimeError("resource closed")

    __repr__ = __str__


class _Unjsonable:
    """A value JSON does not know and whose ``str()`` fails with a long message."""

    def __str__(self) -> str:
        raise ValueError("x" * 10_000)

    __repr__ = __str__


def _deep() -> Any:
    value: Any = []
    for _ in range(200_000):
        value = [value]
    return value


UNRENDERABLE = {
    "str raises": (lambda: _Opaque(), "RuntimeError: resource closed"),
    "str raises inside a map": (lambda: {"handle": _Opaque()}, "RuntimeError: resource closed"),
    "a long message": (lambda: [_Unjsonable()], "ValueError: xxx"),
    "nested too deep": (_deep, "RecursionError"),
}


@pytest.mark.parametrize("case", sorted(UNRENDERABLE))
def test_an_unrenderable_tool_result_is_an_error_result(
    rt: Runtime, fake: FakeOpenAI, case: str
) -> None:
    make, expected = UNRENDERABLE[case]
    rt.tools.register("probe", lambda turn: make())
    register(rt, fake, max_retries=0)
    fake.script(
        Answer(tool_calls=[FakeCall("probe", id="c_1")]),
        Answer(content="the model handled it"),
        Answer(content="next"),
    )
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert (end.stop_reason, end.output) == ("completed", "the model handled it"), end.error
    message = fake.requests[1].messages[-1]
    assert (message["role"], message["tool_call_id"]) == ("tool", "c_1")
    error = json.loads(message["content"])["error"]
    assert error["code"] == "INTERNAL"
    assert expected in error["message"]
    assert "cannot be rendered" in error["message"]
    assert len(error["message"]) <= 2000
    # The interpreter is sane: the next turn runs, deep recursion still works.
    assert run_turn(rt, agent, "again").output == "next"
    assert json.dumps(_nested(sys.getrecursionlimit() // 4)).count("[") > 0


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def test_tool_text_renders_what_it_can() -> None:
    """Text as it is; anything else as JSON (``str`` for what JSON does not know)."""
    assert tool_text("hi \ud800") == "hi \ud800"
    assert tool_text({"a": [1, None]}) == '{"a": [1, null]}'
    assert tool_text({1, 2}) == '"{1, 2}"'
    assert json.loads(tool_text(_Opaque()))["error"]["code"] == "INTERNAL"
