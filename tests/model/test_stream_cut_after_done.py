"""A streamed answer whose connection is cut right after ``data: [DONE]`` (the
server hangs up before the body's last chunk) is a whole answer: it is taken as
it is, not counted as a transport error and asked again -- a retry would run the
model twice (and its tool calls with it), or fail a turn that had its answer.
Text and tool-call answers, over real HTTP on both backends."""

from __future__ import annotations

from typing import Any

import pytest
from model_kit import register, run_turn
from subagents.actors import Runtime
from subagents.actors._model import _grace
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI


def test_an_answer_cut_after_done_is_taken(rt: Runtime, fake: FakeOpenAI) -> None:
    """Without retries the cut failed the turn (``cannot reach the model API``)."""
    register(rt, fake, max_retries=0)
    fake.cut_after_done()
    fake.script(Answer(content="all there"))
    end = run_turn(rt, rt.spawn("planner"), "hi")
    assert (end.stop_reason, end.output, end.error) == ("completed", "all there", None)
    assert end.usage == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert len(fake.requests) == 1


def test_tool_calls_cut_after_done_run_once(rt: Runtime, fake: FakeOpenAI) -> None:
    """With retries the cut answer was asked for again: the second request got the
    script's next answer, and the model's call went unanswered."""
    calls: list[Any] = []
    rt.tools.register("note", lambda _turn, text: calls.append(text) or "noted")
    register(rt, fake)
    fake.cut_after_done()
    fake.script(
        Answer(tool_calls=[FakeCall("note", {"text": "once"})]),
        Answer(content="noted it"),
    )
    end = run_turn(rt, rt.spawn("planner"), "note it")
    assert (end.stop_reason, end.output) == ("completed", "noted it"), end.error
    assert calls == ["once"]
    assert len(fake.requests) == 2
    assert fake.requests[1].messages[-1]["role"] == "tool"


def test_a_body_held_open_after_done_does_not_hold_the_turn(rt: Runtime, fake: FakeOpenAI) -> None:
    """A server that keeps the body open after ``data: [DONE]`` (the last chunk never
    comes): the answer is taken once a short grace passed, not at the request's
    timeout (600 s by default; here 60 s, past the test's bound), and the client
    hangs up on that connection. R-ERR-1: nothing hangs past its bound."""
    calls: list[Any] = []
    rt.tools.register("note", lambda _turn, text: calls.append(text) or "noted")
    register(rt, fake, timeout=60.0)
    fake.hold_after_done(2)
    fake.script(
        Answer(tool_calls=[FakeCall("note", {"text": "once"})]),
        Answer(content="noted it"),
    )
    agent = rt.spawn("planner")
    agent.followup("note it")
    assert agent.wait_idle(20), "the turn waited for the end of a body after its [DONE]"
    end = rt.sessions.turn_ends(agent.session_id)[-1]
    assert (end.stop_reason, end.output) == ("completed", "noted it"), end.error
    assert calls == ["once"]
    assert len(fake.requests) == 2
    assert fake.wait_disconnects(2)  # each held body's connection hung up on
    assert run_turn(rt, agent, "again").output == "echo: again"


def test_an_answer_is_taken_when_its_watchdog_cannot_start(
    rt: Runtime, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog on a body's rest after ``[DONE]`` is a thread of its own, started
    once the answer is whole; a process out of threads (``can't start new thread``)
    failed the turn with its answer in hand. Now the rest of the body is read
    without the bound. R-ERR-1."""

    def no_thread(*_args: Any) -> int:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(_grace, "native_start_thread", no_thread)
    register(rt, fake, max_retries=0)
    fake.script(Answer(content="all there"))
    end = run_turn(rt, rt.spawn("planner"), "hi")
    assert (end.stop_reason, end.output, end.error) == ("completed", "all there", None)
    assert len(fake.requests) == 1
