"""A streamed answer that carries no choice -- only a usage chunk, only ``[DONE]``,
``choices`` that hold no first choice -- or a chunk whose ``choices`` is of the
wrong type fails the turn with ``MODEL_ERROR``, as the same body does
non-streamed; it was a turn completed with output ``""``. The usage-only last
chunk OpenAI sends with ``stream_options.include_usage`` still ends an answer
whose earlier chunks carried its choice. Over real HTTP on both backends.
R-ERR-1 (a failure is typed: ``MODEL_ERROR``, never a completed empty answer)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from model_kit import register, run_turn
from subagents.actors import Runtime
from subagents.actors._model import ChunkAccumulator, ModelError
from subagents.actors.testing import Answer, FakeOpenAI

SSE = {"Content-Type": "text/event-stream"}
DONE = b"data: [DONE]\n\n"


def _sse(*events: Any) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + DONE


def _delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


USAGE = {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}

NO_CHOICE = {
    "a usage chunk only": _sse({"choices": [], "usage": USAGE}),
    "choices a number": _sse({"choices": 5}),
    "choices a string after a choice": _sse(_delta({"content": "hi"}), {"choices": "x"}),
    "choices an object": _sse({"choices": {"index": 0, "delta": {"content": "hi"}}}),
    "choices holding no object": _sse({"choices": [5, None]}),
    "only another index": _sse({"choices": [{"index": 1, "delta": {"content": "hi"}}]}),
    "only [DONE]": DONE,
    "no choices key, then [DONE]": _sse({"id": "x", "usage": USAGE}),
}


@pytest.mark.parametrize("case", sorted(NO_CHOICE))
def test_a_stream_without_a_choice_is_a_model_error(
    rt: Runtime, fake: FakeOpenAI, case: str
) -> None:
    register(rt, fake, stream=True, max_retries=0)
    fake.script(Answer(raw=NO_CHOICE[case], headers=SSE), Answer(content="fine again"))
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert (end.stop_reason, end.output) == ("failed", None)
    assert end.error.startswith("ModelError: [MODEL_ERROR]"), end.error
    assert "choices" in end.error
    assert run_turn(rt, agent, "again").output == "fine again"


@pytest.mark.parametrize(
    "last",
    [
        {"choices": [], "usage": USAGE},
        {"usage": USAGE},
        {"choices": None, "usage": USAGE},
    ],
    ids=["choices empty", "no choices key", "choices null"],
)
def test_a_usage_chunk_after_the_choice_still_ends_the_answer(
    rt: Runtime, fake: FakeOpenAI, last: dict[str, Any]
) -> None:
    """``stream_options.include_usage``: the last chunk has no choice, only usage."""
    register(rt, fake, stream=True, max_retries=0)
    raw = _sse(_delta({"role": "assistant", "content": "hi"}), _delta({}, "stop"), last)
    fake.script(Answer(raw=raw, headers=SSE))
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert (end.stop_reason, end.output) == ("completed", "hi")
    assert end.usage == USAGE


def test_the_accumulator_counts_choices_and_refuses_wrong_types() -> None:
    """The sans-I/O side: ``choices`` of the wrong type is a ``ModelError`` at once;
    a chunk without a first choice is not counted."""
    acc = ChunkAccumulator()
    acc.add({"choices": [], "usage": USAGE})
    acc.add({"usage": USAGE})
    assert (acc.chunks, acc.choices) == (2, 0)
    acc.add(_delta({"content": "hi"}, "stop"))
    assert (acc.chunks, acc.choices) == (3, 1)
    for bad in (5, "x", {"index": 0}, True):
        with pytest.raises(ModelError) as err:
            acc.add({"choices": bad})
        assert err.value.code == "MODEL_ERROR"
