"""The chat-completions wire format without I/O (issue 16 points 2 and 3): server-sent
events split anywhere, tool-call deltas keyed by index, whole answers, retry delays."""

from __future__ import annotations

import email.utils
import json
import time

import pytest
from subagents.actors._model import (
    ChunkAccumulator,
    ModelError,
    SSEDecoder,
    completion_from_response,
    retry_delay,
)

STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"h\xc3\xa9"}}]}\r\n\r\n'
    b": a comment\n"
    b'data: {"choices":[{"index":0,"delta":{"content":"llo"}}]}\n\n'
    b'event: error\ndata: {"error": {"message": "boom"}}\n\n'
    b"data: [DONE]\n\n"
)
EXPECTED = [
    ("message", '{"choices":[{"index":0,"delta":{"role":"assistant","content":"hé"}}]}'),
    ("message", '{"choices":[{"index":0,"delta":{"content":"llo"}}]}'),
    ("error", '{"error": {"message": "boom"}}'),
    ("message", "[DONE]"),
]


def _feed_in(pieces: list[bytes]) -> list[tuple[str, str]]:
    decoder = SSEDecoder()
    events = []
    for piece in pieces:
        events.extend(decoder.feed(piece))
    return events


def test_sse_whole_buffer() -> None:
    assert _feed_in([STREAM]) == EXPECTED


def test_sse_one_byte_at_a_time_splits_crlf_and_utf8() -> None:
    """Every split point: inside ``\\r\\n``, inside the two bytes of ``é``."""
    assert _feed_in([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_sse_trailing_partial_event_is_held_back() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: one\n\ndata: tw") == [("message", "one")]
    assert decoder.feed(b"o\n") == []
    assert decoder.feed(b"\n") == [("message", "two")]


def test_sse_multi_line_data_is_joined() -> None:
    assert _feed_in([b"data: a\ndata: b\n\n"]) == [("message", "a\nb")]


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_tool_call_deltas_keyed_by_index_with_two_parallel_calls() -> None:
    """id and name only in a call's first fragment; arguments split, also between the
    two halves of a surrogate pair; the answer ends with ``tool_calls``."""
    acc = ChunkAccumulator()
    acc.add(_chunk({"role": "assistant", "content": None}))
    acc.add(
        _chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_a", "type": "function", "function": {"name": "x"}}
                ]
            }
        )
    )
    acc.add(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": "\ud83d'}}]}))
    acc.add(
        _chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "call_b", "function": {"name": "y", "arguments": ""}}
                ]
            }
        )
    )
    acc.add(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '\ude00"}'}}]}))
    acc.add(_chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}))
    acc.add(_chunk({}, "tool_calls"))
    acc.add({"choices": [], "usage": {"prompt_tokens": 3, "total_tokens": 4}})
    answer = acc.completion()
    assert [(c.id, c.name) for c in answer.tool_calls] == [("call_a", "x"), ("call_b", "y")]
    assert json.loads(answer.tool_calls[0].arguments) == {"q": "\U0001f600"}
    assert answer.finish_reason == "tool_calls"
    assert answer.content is None
    assert answer.usage == {"prompt_tokens": 3, "total_tokens": 4}
    assert answer.message()["tool_calls"][1]["function"] == {"name": "y", "arguments": "{}"}


def test_error_chunk_raises_model_error() -> None:
    acc = ChunkAccumulator()
    with pytest.raises(ModelError) as err:
        acc.add({"error": {"message": "overloaded", "type": "server_error"}})
    assert err.value.code == "MODEL_ERROR"
    assert "overloaded" in str(err.value)


def test_whole_answer_without_id_created_model() -> None:
    answer = completion_from_response(
        {
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"type": "function", "function": {"name": "f", "arguments": "{}"}}
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
        }
    )
    assert answer.tool_calls[0].id == "call_0"  # a missing id gets a stable one
    assert answer.usage is None


@pytest.mark.parametrize("body", [{}, {"choices": []}, {"error": {"message": "no"}}, []])
def test_unreadable_answers_raise_model_error(body: object) -> None:
    with pytest.raises(ModelError):
        completion_from_response(body)


def test_retry_delay_honours_the_server_then_backs_off() -> None:
    assert retry_delay({"retry-after-ms": "250"}, 0, 2) == 0.25
    assert retry_delay({"retry-after": "1.5"}, 0, 2) == 1.5
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < retry_delay({"retry-after": date}, 0, 2) <= 30
    # Out of range (or absent): exponential backoff with jitter, 0.5 s doubling, 8 s cap.
    assert 0.375 <= retry_delay({"retry-after": "600"}, 0, 2) <= 0.5
    assert 0.75 <= retry_delay(None, 1, 2) <= 1.0
    assert 6.0 <= retry_delay({}, 9, 10) <= 8.0


def test_a_call_whose_head_comes_again_stays_one_call() -> None:
    """Servers that repeat ``id`` and ``name`` in every fragment of a call: one call,
    its arguments joined; a fragment with another id begins the next."""
    acc = ChunkAccumulator()
    head = {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a":'}}
    acc.add(_chunk({"tool_calls": [head]}))
    acc.add(_chunk({"tool_calls": [{**head, "function": {"name": "f", "arguments": " 1}"}}]}))
    acc.add(_chunk({"tool_calls": [{"index": 0, "id": "c2", "function": {"name": "g"}}]}))
    acc.add(_chunk({}, "tool_calls"))
    calls = acc.completion().tool_calls
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("c1", "f", '{"a": 1}'),
        ("c2", "g", ""),
    ]
