"""A ``delegate`` whose child failed tells the model why: the tool result -- and
the delivered result of a background run -- carries ``error`` with the code and
message of the child's failure, as a refused call's result does
(``{"error": {"code", "message"}}``), beside its id and stop reason
(R-ONE-8: the failure is the run's result, not a raise; R-ERR-1: its code).
Before, the model read ``{"stop_reason": "failed", "output": null}`` and no reason."""

from __future__ import annotations

import json
from typing import Any

from model_kit import register, run_turn
from subagents.actors import Runtime, ToolDispatcher, Turn
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI
from subagents.protocol import ErrorCode, SubagentError


def _failing_models(rt: Runtime) -> None:
    def refuses(_turn: Turn) -> Any:
        raise SubagentError("no budget left for this", code=ErrorCode.MODEL_ERROR)

    def raises(_turn: Turn) -> Any:
        raise ValueError("boom")

    rt.models.register("refuses", lambda _o: refuses)
    rt.models.register("raises", lambda _o: raises)


def test_a_failed_delegate_says_why(rt: Runtime, backend: Backend) -> None:
    _failing_models(rt)
    dispatcher = ToolDispatcher()
    results: list[Any] = []
    delivered = backend.event()

    def boss(turn: Turn) -> Any:
        if isinstance(turn.content, dict):  # the background run's result
            results.append(turn.content["delegate_result"])
            delivered.set()
            return "noted"
        for model in ("refuses", "raises"):
            results.append(dispatcher.dispatch(turn, "delegate", {"prompt": "p", "model": model}))
        call = {"prompt": "p", "model": "refuses", "background": True}
        results.append(dispatcher.dispatch(turn, "delegate", call))
        return "asked"

    rt.models.register("boss", lambda _o: boss)
    agent = rt.spawn("boss")
    agent.followup("go")
    assert delivered.wait(20)
    refused, raised, started, background = results
    assert refused["stop_reason"] == "failed" and refused["output"] is None
    assert refused["error"] == {"code": ErrorCode.MODEL_ERROR, "message": "no budget left for this"}
    assert raised["stop_reason"] == "failed"
    assert raised["error"]["code"] == ErrorCode.INTERNAL
    assert "ValueError: boom" in raised["error"]["message"]
    assert started["status"] == "running"
    assert (background["id"], background["stop_reason"]) == (started["id"], "failed")
    assert background["error"] == refused["error"]


def test_the_model_reads_why_its_delegate_failed(rt: Runtime, fake: FakeOpenAI) -> None:
    """Through ``openai_chat``: the ``tool`` message the model reads next says it."""
    _failing_models(rt)
    register(rt, fake)
    fake.script(
        Answer(tool_calls=[FakeCall("delegate", {"prompt": "p", "model": "refuses"})]),
        Answer(content="it could not"),
    )
    end = run_turn(rt, rt.spawn("planner"), "delegate it")
    assert (end.stop_reason, end.output) == ("completed", "it could not"), end.error
    tool = fake.requests[1].messages[-1]
    assert tool["role"] == "tool"
    result = json.loads(tool["content"])
    assert result["stop_reason"] == "failed"
    assert result["error"] == {"code": ErrorCode.MODEL_ERROR, "message": "no budget left for this"}
