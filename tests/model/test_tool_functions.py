"""A tool is called with the turn first (``fn(turn, ...)``): a function that
cannot take it -- ``lambda: time.time()``, a keyword-only ``turn`` -- is refused
where it is registered (``runtime.tools.register``, a setup scope's
``add_tool``, a ``ToolDispatcher``'s extra ``ModelTool``), with
``INVALID_ARGUMENT`` saying so, instead of being shown to models and failing
every call with a ``TypeError`` the model reads. Callables whose signature
cannot be read are let through. R-ERR-1."""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, ModelTool, Runtime, ToolDispatcher
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
