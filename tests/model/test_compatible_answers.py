"""``openai_chat`` against answers OpenAI-compatible servers send that differ from
OpenAI's own, over real HTTP on both backends: parallel tool calls streamed with one
``index`` (Ollama, Gemini) or none, a surrogate pair split between two text chunks,
a refusal or a content-filtered answer, tool-call arguments sent as a JSON object.
R-ERR-1 (a failure is typed: ``MODEL_ERROR``, never a completed empty answer)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from model_kit import register, run_structured_start, run_turn
from subagents.actors import Runtime
from subagents.actors.testing import Answer, FakeOpenAI

SSE = {"Content-Type": "text/event-stream"}
JSON = {"Content-Type": "application/json"}


def _sse(*events: Any, ascii_only: bool = False) -> bytes:
    """``data:`` events, then ``[DONE]``; ``ascii_only`` escapes non-ASCII as ``\\uXXXX``."""
    return (
        b"".join(f"data: {json.dumps(e, ensure_ascii=ascii_only)}\n\n".encode() for e in events)
        + b"data: [DONE]\n\n"
    )


def _delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _whole(message: dict[str, Any], finish: str = "stop") -> bytes:
    answer = {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    return json.dumps(answer).encode()


def _greeter(rt: Runtime) -> list[str]:
    greeted: list[str] = []

    def greet(turn: Any, who: str) -> str:
        greeted.append(who)
        return f"hi {who}"

    rt.tools.register("greet", greet)
    return greeted


def _call(who: str, index: int | None) -> dict[str, Any]:
    call: dict[str, Any] = {
        "id": f"call_{who}",
        "type": "function",
        "function": {"name": "greet", "arguments": json.dumps({"who": who})},
    }
    if index is not None:
        call["index"] = index
    return call


@pytest.mark.parametrize("index", [0, None], ids=["index0", "noindex"])
def test_streamed_parallel_calls_sharing_an_index_stay_apart(
    rt: Runtime, fake: FakeOpenAI, index: int | None
) -> None:
    """Each call has its own ``id`` (and ``name``): a new id starts a new call, even
    under the same ``index`` or with none; both tools run, each answered by its id."""
    greeted = _greeter(rt)
    register(rt, fake, stream=True, max_retries=0)
    raw = _sse(
        _delta({"role": "assistant", "tool_calls": [_call("ann", index)]}),
        _delta({"tool_calls": [_call("bob", index)]}),
        _delta({}, "tool_calls"),
    )
    fake.script(Answer(raw=raw, headers=SSE), Answer(content="done"))
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "greet ann and bob")
    assert (end.stop_reason, end.output) == ("completed", "done")
    assert sorted(greeted) == ["ann", "bob"]
    sent = fake.requests[1].messages
    assert [c["id"] for c in sent[-3]["tool_calls"]] == ["call_ann", "call_bob"]
    assert [(m["tool_call_id"], m["content"]) for m in sent[-2:]] == [
        ("call_ann", "hi ann"),
        ("call_bob", "hi bob"),
    ]


def test_streamed_calls_without_ids_split_on_a_second_name(rt: Runtime, fake: FakeOpenAI) -> None:
    """No ids at all: a fragment naming a tool while the current call has its name
    already is the next call; argument fragments after it belong to that call."""
    greeted = _greeter(rt)
    register(rt, fake, stream=True, max_retries=0)
    raw = _sse(
        _delta({"tool_calls": [{"index": 0, "function": {"name": "greet", "arguments": ""}}]}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"who": "ann"}'}}]}),
        _delta({"tool_calls": [{"index": 0, "function": {"name": "greet"}}]}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"who":'}}]}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": ' "bob"}'}}]}),
        _delta({}, "tool_calls"),
    )
    fake.script(Answer(raw=raw, headers=SSE), Answer(content="done"))
    agent = rt.spawn("planner")
    assert run_turn(rt, agent, "go").output == "done"
    assert sorted(greeted) == ["ann", "bob"]
    ids = [c["id"] for c in fake.requests[1].messages[-3]["tool_calls"]]
    assert len(set(ids)) == 2


def test_a_surrogate_pair_split_between_text_chunks_is_joined(
    rt: Runtime, fake: FakeOpenAI
) -> None:
    """A server escaping non-ASCII as ``\\uXXXX`` cuts an emoji between the halves of
    its pair: the text is joined as tool arguments are (it failed the turn as a
    value the log cannot encode)."""
    register(rt, fake, stream=True, max_retries=0)
    raw = _sse(
        _delta({"role": "assistant", "content": "hi \ud83d"}),
        _delta({"content": "\ude00!"}),
        _delta({}, "stop"),
        ascii_only=True,
    )
    fake.script(Answer(raw=raw, headers=SSE))
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert (end.stop_reason, end.output) == ("completed", "hi \U0001f600!")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_lone_surrogate_in_the_text_becomes_a_replacement_character(
    rt: Runtime, fake: FakeOpenAI, stream: bool
) -> None:
    register(rt, fake, stream=stream, max_retries=0)
    if stream:
        raw = _sse(
            _delta({"content": "a\ud83d"}), _delta({"content": "b"}, "stop"), ascii_only=True
        )
    else:
        raw = _whole({"role": "assistant", "content": "a\ud83db"})
    fake.script(Answer(raw=raw, headers=SSE if stream else JSON))
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert (end.stop_reason, end.output) == ("completed", "a\ufffdb")


REFUSAL = "I'm sorry, I can't help with that."


def _refusal_answer(kind: str, stream: bool) -> Answer:
    if kind == "refusal" and stream:
        raw = _sse(
            _delta({"role": "assistant", "content": None, "refusal": ""}),
            _delta({"refusal": REFUSAL[:10]}),
            _delta({"refusal": REFUSAL[10:]}, "stop"),
        )
    elif kind == "refusal":
        raw = _whole({"role": "assistant", "content": None, "refusal": REFUSAL})
    elif stream:
        raw = _sse(_delta({"content": "Here is how"}), _delta({}, "content_filter"))
    else:
        raw = _whole({"role": "assistant", "content": None}, "content_filter")
    return Answer(raw=raw, headers=SSE if stream else JSON)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("kind", ["refusal", "content_filter"])
def test_a_refusal_or_a_filtered_answer_fails_the_turn(
    rt: Runtime, fake: FakeOpenAI, kind: str, stream: bool
) -> None:
    """Not a completed turn with output "" (a parent's ``delegate`` read that as
    success): ``MODEL_ERROR`` naming the refusal and its text, or the content
    filter; the agent goes on."""
    register(rt, fake, stream=stream, max_retries=0)
    fake.script(_refusal_answer(kind, stream), Answer(content="fine again"))
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert (end.stop_reason, end.output) == ("failed", None)
    assert end.error.startswith("ModelError: [MODEL_ERROR]"), end.error
    if kind == "refusal":
        assert "refused" in end.error and REFUSAL in end.error
    else:
        assert "content filter" in end.error
    assert run_turn(rt, agent, "again").output == "fine again"


def test_a_refusal_of_a_structured_run_is_named(rt: Runtime, fake: FakeOpenAI) -> None:
    """With an output schema the refusal is the error, not a schema mismatch on ""."""
    register(rt, fake, stream=False, max_retries=0)
    fake.script(_refusal_answer("refusal", stream=False))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    result, error = run_structured_start(rt, schema)
    assert result.stop_reason == "failed"
    assert "MODEL_ERROR" in error and REFUSAL in error, error


@pytest.mark.parametrize(
    "arguments", [{"who": "b\u00f6b"}, '{"who": "b\u00f6b"}'], ids=["object", "text"]
)
def test_whole_answer_arguments_as_a_json_object_are_used(
    rt: Runtime, fake: FakeOpenAI, arguments: Any
) -> None:
    """Some compatible servers send ``arguments`` as the object itself, not its JSON
    text: it runs (it was a Python repr, refused as not JSON), and it is sent back
    to the model as JSON text."""
    greeted = _greeter(rt)
    register(rt, fake, stream=False, max_retries=0)
    call = {"id": "c1", "type": "function", "function": {"name": "greet", "arguments": arguments}}
    raw = _whole({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls")
    fake.script(Answer(raw=raw, headers=JSON), Answer(content="done"))
    agent = rt.spawn("planner")
    assert run_turn(rt, agent, "go").output == "done"
    assert greeted == ["b\u00f6b"]
    echoed = fake.requests[1].messages[-2]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(echoed) == {"who": "b\u00f6b"}


def test_a_stream_opening_with_a_byte_order_mark_keeps_its_first_event(
    rt: Runtime, fake: FakeOpenAI
) -> None:
    """A stream whose body opens with a UTF-8 byte-order mark (the SSE standard
    says to skip it): its first event, here the first tool call's head with its id
    and name, was read as a field named ``\\ufeffdata`` and dropped -- the call then
    had no name. R-ERR-1 (no answer silently changed)."""
    greeted = _greeter(rt)
    register(rt, fake, stream=True, max_retries=0)
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "greet"}}
    raw = _sse(
        _delta({"role": "assistant", "tool_calls": [call]}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"who": "ann"}'}}]}),
        _delta({}, "tool_calls"),
    )
    fake.script(Answer(raw=b"\xef\xbb\xbf" + raw, headers=SSE), Answer(content="done"))
    agent = rt.spawn("planner")
    assert run_turn(rt, agent, "go").output == "done"
    assert greeted == ["ann"]
