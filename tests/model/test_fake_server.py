"""The loopback fake OpenAI server speaks the real wire format over real HTTP
(issue 16 point 3): whole answers, SSE chunks ending with ``data: [DONE]``, tool-call
deltas keyed by index, errors with ``{"error": ...}`` bodies, an error event mid-stream,
answers without ids, the real API's refusal of an unmatched ``tool_call_id``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from subagents.actors._model import ChunkAccumulator, SSEDecoder
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI

HEADERS = {"Authorization": "Bearer test-key"}
USER = [{"role": "user", "content": "hi"}]


def _post(fake: FakeOpenAI, body: dict[str, Any], headers: Any = HEADERS) -> httpx.Response:
    with httpx.Client() as client:
        return client.post(f"{fake.base_url}/chat/completions", json=body, headers=headers)


def _events(fake: FakeOpenAI, body: dict[str, Any]) -> tuple[list[bytes], list[tuple[str, str]]]:
    """The raw pieces as they arrived, and the decoded events."""
    pieces: list[bytes] = []
    decoder = SSEDecoder()
    events = []
    with (
        httpx.Client() as client,
        client.stream(
            "POST", f"{fake.base_url}/chat/completions", json=body, headers=HEADERS
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for piece in response.iter_raw():
            pieces.append(piece)
            events.extend(decoder.feed(piece))
    return pieces, events


def test_whole_answer(fake: FakeOpenAI) -> None:
    fake.script(Answer(content="hello", usage={"prompt_tokens": 1, "total_tokens": 2}))
    response = _post(fake, {"model": "m", "messages": USER})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"] and body["model"] == "m" and isinstance(body["created"], int)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 1, "total_tokens": 2}
    assert fake.requests[0].body["messages"] == USER


def test_stream_of_two_parallel_tool_calls(fake: FakeOpenAI) -> None:
    calls = [FakeCall("delegate", {"prompt": "caf\u00e9 \U0001f600"}, id="call_x"), FakeCall("g")]
    fake.script(Answer(tool_calls=calls))
    body = {
        "model": "m",
        "messages": USER,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    _, events = _events(fake, body)
    assert events[-1] == ("message", "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    fragments = [
        tc for c in chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls", ())
    ]
    first = {}
    for frag in fragments:
        if frag["index"] not in first:
            first[frag["index"]] = frag
            assert frag["id"] and frag["function"]["name"]
        else:  # later fragments carry arguments only
            assert "id" not in frag and "name" not in frag["function"]
    assert [f["id"] for f in first.values()] == ["call_x", "call_1"]
    assert sum(1 for f in fragments if f["index"] == 0) >= 3  # arguments over several chunks
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == ["tool_calls"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 15
    acc = ChunkAccumulator()
    for chunk in chunks:
        acc.add(chunk)
    answer = acc.completion()
    assert json.loads(answer.tool_calls[0].arguments) == {"prompt": "caf\u00e9 \U0001f600"}


def test_split_utf8_cuts_bytes_inside_a_character(fake: FakeOpenAI) -> None:
    fake.script(Answer(content="d\u00e9j\u00e0 vu", split_utf8=True))
    pieces, events = _events(fake, {"model": "m", "messages": USER, "stream": True})
    # Some piece as it arrived ends inside a character (best effort: TCP may merge writes).
    joined = b"".join(pieces)
    text = "".join(
        json.loads(d)["choices"][0]["delta"].get("content") or "" for _, d in events[:-2]
    )
    assert text == "d\u00e9j\u00e0 vu"
    assert joined.count(b"data: ") == len(events)


def test_no_usage_chunk_unless_asked(fake: FakeOpenAI) -> None:
    fake.script(Answer(content="x"))
    _, events = _events(fake, {"model": "m", "messages": USER, "stream": True})
    assert all("usage" not in json.loads(d) for _, d in events[:-1])


def test_answer_without_id_created_model(fake: FakeOpenAI) -> None:
    fake.script(Answer(content="x", omit_ids=True), Answer(content="y", omit_ids=True))
    body = _post(fake, {"model": "m", "messages": USER}).json()
    assert not {"id", "created", "model"} & set(body)
    _, events = _events(fake, {"model": "m", "messages": USER, "stream": True})
    assert all(not {"id", "created", "model"} & set(json.loads(d)) for _, d in events[:-1])


def test_invalid_json_arguments_are_sent_verbatim(fake: FakeOpenAI) -> None:
    fake.script(Answer(tool_calls=[FakeCall("f", '{"a": ')]))
    body = _post(fake, {"model": "m", "messages": USER}).json()
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"a": '


@pytest.mark.parametrize("status", [429, 500])
def test_scripted_http_errors_have_an_error_body(fake: FakeOpenAI, status: int) -> None:
    fake.script(Answer(status=status, error="try later", headers={"retry-after-ms": "5"}))
    response = _post(fake, {"model": "m", "messages": USER})
    assert response.status_code == status
    assert response.json()["error"]["message"] == "try later"
    assert response.headers["retry-after-ms"] == "5"


def test_error_event_mid_stream(fake: FakeOpenAI) -> None:
    fake.script(Answer(content="partial answer", stream_error_after=2, error="overloaded"))
    _, events = _events(fake, {"model": "m", "messages": USER, "stream": True})
    assert events[-1][0] == "error"
    assert json.loads(events[-1][1])["error"]["message"] == "overloaded"
    assert ("message", "[DONE]") not in events


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([*USER, {"role": "tool", "tool_call_id": "call_9", "content": "1"}], "preceeding"),
        (
            [
                *USER,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "f"}},
                        {"id": "call_2", "type": "function", "function": {"name": "g"}},
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "1"},
                {"role": "user", "content": "next"},
            ],
            "call_2",
        ),
    ],
)
def test_unmatched_tool_call_id_is_rejected(
    fake: FakeOpenAI, messages: list[Any], needle: str
) -> None:
    response = _post(fake, {"model": "m", "messages": messages})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and needle in error["message"]


def test_wrong_key_is_refused(fake: FakeOpenAI) -> None:
    response = _post(fake, {"model": "m", "messages": USER}, {"Authorization": "Bearer no"})
    assert response.status_code == 401
    assert "error" in response.json()


def test_the_openai_package_reads_it() -> None:
    """Cross-check with the official client, where it is installed."""
    openai = pytest.importorskip("openai")
    with FakeOpenAI() as fake:
        fake.script(
            Answer(tool_calls=[FakeCall("f", {"a": "\U0001f600"}), FakeCall("g")], split_utf8=True),
            Answer(content="done", omit_ids=True),
        )
        client = openai.OpenAI(base_url=fake.base_url, api_key="test-key", max_retries=0)
        try:
            with client.chat.completions.create(model="m", messages=USER, stream=True) as stream:
                parts: dict[int, str] = {}
                for chunk in stream:
                    for choice in chunk.choices:
                        for tc in choice.delta.tool_calls or ():
                            parts[tc.index] = parts.get(tc.index, "") + tc.function.arguments
            # The package concatenates fragments as they come: a character cut between
            # its surrogate halves stays two lone surrogates until the caller joins them
            # (our ChunkAccumulator does).
            joined = parts[0].encode("utf-16", "surrogatepass").decode("utf-16")
            assert json.loads(joined) == {"a": "\U0001f600"}
            whole = client.chat.completions.create(model="m", messages=USER)
            assert whole.choices[0].message.content == "done"
        finally:
            client.close()
