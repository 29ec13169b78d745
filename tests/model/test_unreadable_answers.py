"""``openai_chat`` against answers it cannot use, over real HTTP on both backends.

An answer the model's API sent but that cannot be read -- a field of the wrong
type, a body that is not UTF-8, a content encoding that does not decode, JSON
nested past the parser, a stream that broke off before its end -- fails the turn
with ``MODEL_ERROR`` (never a raw ``TypeError`` or ``RecursionError``), and the
agent goes on. A tool call when tools are off is a tool error the model reads,
and a usage block the log cannot hold is ignored, not a write that stops the
session. R-ERR (typed errors at a boundary: bytes from the wire).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from subagents.actors import Runtime, openai_chat
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI

SSE = {"Content-Type": "text/event-stream"}


def _sse(*events: Any) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


UNREADABLE = {
    "tool_calls a number": (
        b'{"choices":[{"index":0,"message":{"role":"assistant","tool_calls":5}}]}',
        None,
    ),
    "tool_calls a number, streamed": (
        _sse({"choices": [{"index": 0, "delta": {"tool_calls": 5}}]}),
        SSE,
    ),
    "not UTF-8": (
        b'{"choices":[{"index":0,"message":{"role":"assistant","content":"\xff"}}]}',
        None,
    ),
    "a gzip body that is not gzip": (b"not gzip", {"Content-Encoding": "gzip"}),
    "JSON nested past the parser": (b'{"choices":' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
}


def _register(rt: Runtime, fake: FakeOpenAI, **kw: Any) -> None:
    rt.models.register(
        "planner", openai_chat("gpt-test", base_url=fake.base_url, api_key="test-key", **kw)
    )


def _turn(rt: Runtime, agent: Any, content: Any) -> Any:
    agent.followup(content)
    assert agent.wait_idle(20)
    return rt.sessions.turn_ends(agent.session_id)[-1]


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_an_unreadable_answer_is_a_model_error(rt: Runtime, fake: FakeOpenAI, case: str) -> None:
    raw, headers = UNREADABLE[case]
    _register(rt, fake, stream=headers is SSE, max_retries=0)
    fake.script(Answer(raw=raw, headers=headers), Answer(content="fine again"))
    agent = rt.spawn("planner")
    end = _turn(rt, agent, "go")
    assert end.stop_reason == "failed"
    assert end.error.startswith("ModelError: [MODEL_ERROR]"), end.error
    assert _turn(rt, agent, "again").output == "fine again"


@pytest.mark.parametrize("calls", [(), (FakeCall("list_agents", {}),)], ids=["text", "tool"])
def test_a_stream_that_broke_off_is_a_model_error(
    rt: Runtime, fake: FakeOpenAI, calls: tuple[FakeCall, ...]
) -> None:
    """Text or a tool call's arguments cut off with no finish reason and no
    ``[DONE]``: not an answer (it was recorded as a completed one), and no tool
    runs on half its arguments."""
    _register(rt, fake, stream=True, max_retries=0)
    fake.script(Answer(content="The answer is", tool_calls=calls, cut_stream=True))
    agent = rt.spawn("planner")
    end = _turn(rt, agent, "go")
    assert (end.stop_reason, end.output) == ("failed", None)
    assert "MODEL_ERROR" in end.error and "broke off" in end.error
    assert len(fake.requests) == 1


def test_a_tool_call_with_tools_off_is_a_tool_error(rt: Runtime, fake: FakeOpenAI) -> None:
    _register(rt, fake, tools=False)
    fake.script(Answer(tool_calls=[FakeCall("delegate", {"prompt": "x"})]), Answer(content="ok"))
    agent = rt.spawn("planner")
    end = _turn(rt, agent, "go")
    assert (end.stop_reason, end.output) == ("completed", "ok")
    result = json.loads(fake.requests[1].messages[-1]["content"])
    assert result["error"]["message"] == "no tools"


def test_usage_the_log_cannot_hold_is_ignored(
    backend: Any, fake: FakeOpenAI, tmp_path: Any
) -> None:
    """A counter past 2**64 - 1 or a name UTF-8 cannot encode is dropped, and a sum
    stops at 2**64 - 1: the turn's end is written, the session goes on."""
    db = str(tmp_path / "usage.db")
    with Runtime(db, backend=backend) as rt:
        _register(rt, fake)
        huge = {"prompt_tokens": 2**64, "total_tokens": 2**64 - 1, "\ud800": 1}
        fake.script(
            Answer(tool_calls=[FakeCall("list_agents", {})], usage=huge),
            Answer(content="counted", usage={"total_tokens": 5, "completion_tokens": 2}),
            Answer(content="next"),
        )
        agent = rt.spawn("planner")
        assert _turn(rt, agent, "go").output == "counted"
        assert _turn(rt, agent, "again").output == "next"
        sid = agent.session_id
    with Runtime(db, backend=backend) as rt:
        ends = rt.sessions.turn_ends(sid)
        assert [e.stop_reason for e in ends] == ["completed", "completed"]
        assert ends[0].usage == {"total_tokens": 2**64 - 1, "completion_tokens": 2}


def test_a_turn_keeps_at_most_max_counters_usage_counters(backend: Any, tmp_path: Any) -> None:
    """Counters past :data:`MAX_COUNTERS` of a turn are dropped (those it has still
    sum): a behaviour adding 100,001 made the turn's end a record the log could
    not hold -- the session's writes stopped, and its message ran again (and
    failed again) at every resume."""
    from subagents.actors._agents._turn import MAX_COUNTERS

    db = str(tmp_path / "usage.db")

    def counting(turn: Any) -> str:
        turn.add_usage({f"c{i}": 1 for i in range(100_001)})
        turn.add_usage({"c0": 2, "brand new": 1})
        return "counted"

    with Runtime(db, backend=backend) as rt:
        agent = rt.spawn(counting)
        agent.followup("go")
        assert agent.wait_idle(20)
        agent.followup("again")
        assert agent.wait_idle(20)
        assert rt.sessions.statistics().persistence_failures == ()
        sid = agent.session_id
    with Runtime(db, backend=backend) as rt:
        ends = rt.sessions.turn_ends(sid)
        assert [e.stop_reason for e in ends] == ["completed", "completed"]
        usage = ends[0].usage
        assert usage is not None and len(usage) == MAX_COUNTERS
        assert usage["c0"] == 3 and "brand new" not in usage
