"""A structured run whose answer the model cut off (``finish_reason: "length"``, the
token limit reached) fails naming the cut -- ``MODEL_ERROR``, as a refusal or a
filtered answer does -- not with a schema mismatch on half an answer; an answer
that is complete and does not match still fails the schema check. Streamed and
whole answers, over real HTTP on both backends. R-ONE-9, R-ERR-1."""

from __future__ import annotations

import json

import pytest
from model_kit import register, run_structured_start, run_turn
from subagents.actors import Runtime
from subagents.actors.testing import Answer, FakeOpenAI

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
    "required": ["a", "b"],
}


def _answer(content: str, finish: str, stream: bool) -> Answer:
    if stream:
        events = [
            {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        ]
        raw = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events)
        return Answer(raw=raw + b"data: [DONE]\n\n", headers={"Content-Type": "text/event-stream"})
    message = {"role": "assistant", "content": content}
    body = {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    return Answer(raw=json.dumps(body).encode(), headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_structured_answer_cut_off_by_length_says_so(
    rt: Runtime, fake: FakeOpenAI, stream: bool
) -> None:
    register(rt, fake, stream=stream, max_retries=0)
    fake.script(_answer('{"a": 1, "b": "a long te', "length", stream))
    agent = rt.spawn("planner", output_schema=SCHEMA)
    end = run_turn(rt, agent, "go")
    assert (end.stop_reason, end.output, end.structured) == ("failed", None, None)
    assert end.error.startswith("ModelError: [MODEL_ERROR]"), end.error
    assert "cut off" in end.error and "length" in end.error, end.error
    assert "schema" not in end.error.replace("output schema", ""), end.error


def test_a_cut_off_answer_that_still_parses_is_not_taken(rt: Runtime, fake: FakeOpenAI) -> None:
    """Cut where it happens to be valid JSON (``12`` of ``123``): still cut off, not
    a completed run with a value the model did not give."""
    register(rt, fake, stream=False, max_retries=0)
    fake.script(_answer("12", "length", stream=False))
    agent = rt.spawn("planner", output_schema={"type": "integer"})
    end = run_turn(rt, agent, "go")
    assert end.stop_reason == "failed" and "cut off" in end.error, end


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_complete_answer_that_does_not_match_still_fails_the_schema(
    rt: Runtime, fake: FakeOpenAI, stream: bool
) -> None:
    register(rt, fake, stream=stream, max_retries=0)
    fake.script(_answer('{"a": "one", "b": "x"}', "stop", stream))
    agent = rt.spawn("planner", output_schema=SCHEMA)
    end = run_turn(rt, agent, "go")
    assert end.stop_reason == "failed"
    assert "does not match the output schema" in end.error, end.error
    assert "cut off" not in end.error


def test_a_one_shot_run_cut_off_by_length_reports_it(rt: Runtime, fake: FakeOpenAI) -> None:
    """Through ``start``: the run settles not ``completed``, and the child's turn
    names the cut (what a delegating parent reads back)."""
    register(rt, fake, stream=True, max_retries=0)
    fake.script(_answer('{"a": 1', "length", stream=True))
    result, error = run_structured_start(rt, SCHEMA)
    assert result.stop_reason == "failed"
    assert "MODEL_ERROR" in error and "cut off" in error, error


def test_text_cut_off_without_a_schema_is_kept(rt: Runtime, fake: FakeOpenAI) -> None:
    """Unchanged: without a schema the text so far is the output (the model may say
    more in a later turn)."""
    register(rt, fake, stream=True, max_retries=0)
    fake.script(_answer("The first part of", "length", stream=True))
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert (end.stop_reason, end.output) == ("completed", "The first part of")
