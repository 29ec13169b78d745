"""A tool is called with the turn first (``fn(turn, ...)``): a function that
cannot take it -- ``lambda: time.time()``, a keyword-only ``turn`` -- is refused
where it is registered (``runtime.tools.register``, a setup scope's
``add_tool``, a ``ToolDispatcher``'s extra ``ModelTool``), with
``INVALID_ARGUMENT`` saying so, instead of being shown to models and failing
every call with a ``TypeError`` the model reads. Callables whose signature
cannot be read are let through. A runtime tool's parameters are typed from their
annotations, generic and optional ones too. R-ERR-1."""

from __future__ import annotations

import functools
import json
import time
from typing import Any, Literal, Optional

import pytest
from model_kit import register
from subagents.actors import ContinuableStartSpec, ModelTool, Runtime, ToolDispatcher
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI
from subagents.protocol import ErrorCode, SubagentError


def _kw_only(*, turn: Any) -> str:
    return "x"


NO_TURN: dict[str, Any] = {
    "no parameter": lambda: time.time(),
    "keyword-only turn": _kw_only,
    "a partial that binds it": functools.partial(lambda turn: 1, turn=None),
}


def _takes_turn(turn: Any, *args: Any) -> str:
    return "ok"


class _Callable:
    def __call__(self, turn: Any, query: str = "") -> str:
        return query


TAKES_TURN: dict[str, Any] = {
    "a function": _takes_turn,
    "a lambda": lambda turn, query: query,
    "only *args": lambda *args: args,
    "a callable object": _Callable(),
    "print": print,
}


@pytest.mark.parametrize("case", sorted(NO_TURN))
def test_a_function_that_cannot_take_the_turn_is_refused_everywhere(rt: Runtime, case: str) -> None:
    fn = NO_TURN[case]
    with pytest.raises(SubagentError, match="turn") as err:
        rt.tools.register("clock", fn)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert "clock" not in rt.tools.visible(None, {})
    with pytest.raises(SubagentError, match="turn") as err:
        ToolDispatcher(extra={"clock": ModelTool("d", {"type": "object"}, fn)})
    assert err.value.code == ErrorCode.INVALID_ARGUMENT

    refused: list[str] = []

    def setup(scope: Any) -> None:
        try:
            scope.add_tool("clock", fn)
        except SubagentError as exc:
            refused.append(exc.code)

    rt.subagents.register_continuable_setup(setup)
    parent = rt.spawn("echo")
    spec = ContinuableStartSpec(parent=parent, provider="local", prompt="p", label="c")
    rt.subagents.start_continuable(spec)
    assert rt.wait_idle(20)
    assert refused == [ErrorCode.INVALID_ARGUMENT]


def test_functions_that_take_the_turn_pass(rt: Runtime) -> None:
    for name, fn in TAKES_TURN.items():
        rt.tools.register(name.replace(" ", "_").replace("*", ""), fn)
        ToolDispatcher(extra={"t": ModelTool("d", {"type": "object"}, fn)})
    rt.tools.register("opaque", functools.partial(print))  # no readable signature needed
    # The first refused case, so this test fails where nothing is refused.
    with pytest.raises(SubagentError):
        rt.tools.register("clock", NO_TURN["no parameter"])


def test_a_tools_generic_optional_and_literal_parameters_are_typed(
    rt: Runtime, fake: FakeOpenAI
) -> None:
    """``list[str]``, ``dict[str, int]``, ``int | None``, ``Optional[float]`` and a
    ``Literal`` are described as the JSON types they are (they were shown as
    anything, ``{}``), and a call that does not fit is refused to the model."""

    def search(
        turn: Any,
        terms: list[str],
        weights: dict[str, int],
        limit: int | None = None,
        cutoff: Optional[float] = None,  # noqa: UP045  (the older spelling, on purpose)
        order: Literal["new", "old"] = "new",
        anything: Any = None,
    ) -> str:
        return f"{terms} {limit} {order}"

    rt.tools.register("search", search)
    register(rt, fake, max_retries=0)
    fake.script(
        Answer(tool_calls=[FakeCall("search", {"terms": ["a"], "weights": {}, "limit": "3"})]),
        Answer(tool_calls=[FakeCall("search", {"terms": ["a"], "weights": {}, "limit": None})]),
        Answer(content="done"),
    )
    agent = rt.spawn("planner")
    agent.followup("go")
    assert agent.wait_idle(20)
    assert rt.sessions.turn_ends(agent.session_id)[-1].output == "done"
    shown = next(
        t["function"] for t in fake.requests[0].body["tools"] if t["function"]["name"] == "search"
    )
    assert shown["parameters"]["properties"] == {
        "terms": {"type": "array"},
        "weights": {"type": "object"},
        "limit": {"type": ["integer", "null"]},
        "cutoff": {"type": ["number", "null"]},
        "order": {"enum": ["new", "old"]},
        "anything": {},
    }
    refused = json.loads(fake.requests[1].messages[-1]["content"])
    assert (
        refused["error"]["code"] == ErrorCode.INVALID_ARGUMENT
        and "limit" in refused["error"]["message"]
    )
    assert fake.requests[2].messages[-1]["content"] == "['a'] None new"
