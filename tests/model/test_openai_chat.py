"""``openai_chat`` against the fake server over real HTTP, on both backends (issue 16
point 2): persona as system prompt, history as messages, the tool-call loop with
parallel calls and ``tool_call_id`` matching, streaming or not, retries on 429/5xx
honouring ``retry-after-ms``, a timeout, cancellation aborting the request, token
usage recorded on the turn's end."""

from __future__ import annotations

import json
from typing import Any

import pytest
from model_kit import register, run_turn
from subagents.actors import AgentOptions, ContinuableStartSpec, Runtime, openai_chat
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI
from subagents.protocol import ErrorCode, SubagentError, decode_event, encode_event

FAST = {"retry-after-ms": "1"}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_tool_loop_with_parallel_calls(rt: Runtime, fake: FakeOpenAI, stream: bool) -> None:
    rt.models.register("adder", lambda _o: lambda t: f"sum of {t.content}")
    register(rt, fake, stream=stream)
    fake.script(
        Answer(
            tool_calls=[
                FakeCall("delegate", {"prompt": "2+2 \U0001f600", "model": "adder"}, id="c_1"),
                FakeCall("list_agents", {}, id="c_2"),
            ],
            split_utf8=True,
            usage={"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        ),
        Answer(content="It is 4.", usage={"prompt_tokens": 20, "completion_tokens": 4}),
    )
    agent = rt.spawn("planner", options=AgentOptions(persona="You plan."))
    end = run_turn(rt, agent, "what is 2+2?")
    assert (end.stop_reason, end.output) == ("completed", "It is 4.")
    assert end.usage == {"prompt_tokens": 27, "completion_tokens": 7, "total_tokens": 10}
    first, second = fake.requests
    assert first.body["model"] == "gpt-test"
    assert first.body["messages"] == [
        {"role": "system", "content": "You plan."},
        {"role": "user", "content": "what is 2+2?"},
    ]
    assert first.tool_names == [
        "delegate",
        "start_agent",
        "send_message",
        "interrupt",
        "list_agents",
    ]
    assert first.body.get("stream", False) is stream
    tools = second.body["messages"][-2:]
    assert [m["tool_call_id"] for m in tools] == ["c_1", "c_2"]
    delegated = json.loads(tools[0]["content"])
    assert delegated["output"] == "sum of 2+2 \U0001f600"
    assert second.body["messages"][-3]["tool_calls"][0]["id"] == "c_1"


def test_history_and_reports_become_messages(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake, system="Default system.")
    fake.script(Answer(content="first answer"), Answer(content="second answer"))
    agent = rt.spawn("planner")
    run_turn(rt, agent, "one")
    run_turn(rt, agent, {"k": "two"})
    assert fake.requests[1].messages == [
        {"role": "system", "content": "Default system."},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": '{"k": "two"}'},
    ]


def test_max_history_sends_the_last_messages_of_earlier_turns(
    rt: Runtime, fake: FakeOpenAI
) -> None:
    """``max_history=n``: each request carries the system prompt, the last ``n``
    messages of earlier turns -- from a user message on (a window that would
    start at an answer starts after it) -- and the turn's own message, always."""
    register(rt, fake, name="short", system="Sys.", max_history=3)
    fake.script(*[Answer(content=f"answer {i}") for i in range(4)])
    agent = rt.spawn("short")
    for i in range(4):
        run_turn(rt, agent, f"q{i}")
    contents = [[m["content"] for m in r.messages] for r in fake.requests]
    assert contents == [
        ["Sys.", "q0"],
        ["Sys.", "q0", "answer 0", "q1"],
        # The last 3 of q0 a0 q1 a1 begin at an answer: from q1 on.
        ["Sys.", "q1", "answer 1", "q2"],
        ["Sys.", "q2", "answer 2", "q3"],
    ]
    register(rt, fake, name="none", max_history=0)
    fake.script(Answer(content="alone"))
    run_turn(rt, rt.spawn("none"), "only")
    assert [m["content"] for m in fake.requests[-1].messages] == ["only"]


def test_a_continuable_child_reports_through_the_tool(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake)
    parent = rt.spawn("echo")
    fake.script(
        Answer(tool_calls=[FakeCall("report", {"content": "found it", "delivery": "quiet"})]),
        Answer(content="reported"),
    )
    child = rt.subagents.start_continuable(
        ContinuableStartSpec(
            parent=parent, provider="local", prompt="look", label="c", model="planner"
        )
    ).child_id
    assert fake.wait_requests(2)
    assert "report" in fake.requests[0].tool_names
    reply = json.loads(fake.requests[1].messages[-1]["content"])
    assert len(reply["message_id"]) == 32
    live = rt.agents.get(child)
    assert live is None or live.wait_idle(10)


def test_invalid_arguments_come_back_and_the_loop_goes_on(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake)
    fake.script(
        Answer(tool_calls=[FakeCall("delegate", '{"prompt": ')]),
        Answer(tool_calls=[FakeCall("report", {"content": "x"})]),  # not shown to a root
        Answer(content="gave up"),
    )
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert end.output == "gave up"
    errors = [json.loads(r.messages[-1]["content"])["error"]["code"] for r in fake.requests[1:]]
    assert errors == [ErrorCode.INVALID_ARGUMENT, ErrorCode.UNAUTHORIZED]


@pytest.mark.parametrize("status", [429, 500, 503])
def test_retries_honour_retry_after(rt: Runtime, fake: FakeOpenAI, status: int) -> None:
    register(rt, fake)
    fake.script(
        Answer(status=status, error="busy", headers=FAST),
        Answer(status=status, error="busy", headers=FAST),
        Answer(content="third time"),
    )
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert (end.stop_reason, end.output) == ("completed", "third time")
    assert len(fake.requests) == 3


def test_retries_run_out_and_the_turn_fails(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake, max_retries=1)
    fake.script(*[Answer(status=429, error="rate limited", headers=FAST)] * 2)
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert end.stop_reason == "failed"
    assert "MODEL_ERROR" in end.error and "429" in end.error and "rate limited" in end.error
    assert len(fake.requests) == 2


def test_a_client_error_is_not_retried(rt: Runtime, fake: FakeOpenAI) -> None:
    rt.models.register(
        "planner", openai_chat("gpt-test", base_url=fake.base_url, api_key="wrong-key")
    )
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert end.stop_reason == "failed" and "401" in end.error
    assert len(fake.requests) == 0  # refused before it was scripted: never counted


def test_an_error_event_mid_stream_fails_the_turn(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake)
    fake.script(Answer(content="half an answer", stream_error_after=2, error="overloaded"))
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert end.stop_reason == "failed" and "overloaded" in end.error


def test_answers_without_ids(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake)
    fake.script(
        Answer(tool_calls=[FakeCall("list_agents")], omit_ids=True),
        Answer(content="none", omit_ids=True),
    )
    agent = rt.spawn("planner")
    assert run_turn(rt, agent, "go").output == "none"


def test_cancellation_aborts_the_http_request(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake)
    fake.script(Answer(content="too late", stall=True))
    agent = rt.spawn("planner")
    agent.followup("go")
    assert fake.wait_requests(1)
    agent.cancel("stop thinking")
    assert agent.wait_idle(10)
    assert fake.wait_disconnects(1)  # the client hung up: the request was aborted
    end = rt.sessions.turn_ends(agent.session_id)[-1]
    assert end.stop_reason == "cancelled"


def test_a_timeout_fails_the_turn(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake, timeout=0.2, max_retries=0)
    fake.script(Answer(content="never", stall=True))
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert end.stop_reason == "failed" and "TIMEOUT" in end.error
    fake.release()


def test_usage_is_durable(backend: Any, fake: FakeOpenAI, tmp_path: Any) -> None:
    """``turn/end`` keeps the usage in the log; a turn without a model keeps none."""
    with Runtime(str(tmp_path / "db.sqlite"), backend=backend) as rt:
        register(rt, fake)
        fake.script(Answer(content="x", usage={"prompt_tokens": 5, "total_tokens": 9}))
        agent = rt.spawn("planner")
        run_turn(rt, agent, "go")
        echo = rt.spawn("echo")
        run_turn(rt, echo, "go")
        sid, eid = agent.session_id, echo.session_id
    with Runtime(str(tmp_path / "db.sqlite"), backend=backend) as rt:
        assert rt.sessions.turn_ends(sid)[-1].usage == {"prompt_tokens": 5, "total_tokens": 9}
        end = rt.sessions.turn_ends(eid)[-1]
        assert end.usage is None
        assert b"usage" not in encode_event(end)  # old logs keep their bytes
        again = decode_event(encode_event(rt.sessions.turn_ends(sid)[-1]))
        assert again.usage == {"prompt_tokens": 5, "total_tokens": 9}


def test_configuration_from_the_environment(
    rt: Runtime, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj_1")
    rt.models.register("planner", openai_chat("gpt-test"))
    fake.script(Answer(content="from env"))
    agent = rt.spawn("planner")
    assert run_turn(rt, agent, "go").output == "from env"
    assert fake.requests[0].headers["OpenAI-Project"] == "proj_1"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model": ""},
        {"model": "m", "base_url": "ftp://x"},
        {"model": "m", "timeout": -1},
        {"model": "m", "max_tool_rounds": -1},
        {"model": "m", "tools": "all"},
    ],
)
def test_bad_configuration(kwargs: dict[str, Any]) -> None:
    with pytest.raises(SubagentError) as err:
        openai_chat(api_key="k", **kwargs)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT


def test_no_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(SubagentError) as err:
        openai_chat("m")
    assert err.value.code == ErrorCode.INVALID_ARGUMENT and "OPENAI_API_KEY" in str(err.value)


def test_a_waiting_request_stalls_no_one(rt: Runtime, fake: FakeOpenAI) -> None:
    """On gevent the HTTP call runs in the hub's threadpool: while one agent waits for
    its model, another agent's turns run (on threads, trivially)."""
    register(rt, fake)
    fake.script(Answer(content="at last", stall=True))
    thinker = rt.spawn("planner")
    thinker.followup("go")
    assert fake.wait_requests(1)
    other = rt.spawn("echo")
    assert run_turn(rt, other, "still running").output == "still running"
    assert not thinker.idle
    fake.release()
    assert thinker.wait_idle(10)
    assert rt.sessions.turn_ends(thinker.session_id)[-1].output == "at last"


def test_no_tool_call_starts_after_its_turn_was_cancelled(rt: Runtime, fake: FakeOpenAI) -> None:
    """R-INT-1: an answer asks for more tool calls than run at once; the turn is
    interrupted while the first eight run. None of the queued ones starts after
    that -- no side effect, no child started for a cancelled turn (all twelve
    used to run, and six children were started)."""
    from subagents.actors import UserAuthority
    from subagents.actors._model._openai import PARALLEL_TOOL_CALLS
    from subagents.actors.testing import Gate

    lock = rt.backend.lock()
    started: list[tuple[int, bool]] = []
    running = rt.backend.event()
    gate = Gate("tools")

    def send_email(turn: Any, n: int) -> str:
        """A tool with a side effect."""
        with lock:
            started.append((n, turn.cancelled))
            if len(started) == PARALLEL_TOOL_CALLS:
                running.set()
        gate.pass_through()
        return f"sent {n}"

    rt.tools.register("send_email", send_email)
    register(rt, fake)
    parent = rt.spawn("echo", label="parent")
    fake.script(Answer(content="ready"))
    cid, _ = rt.subagents.start_continuable(
        ContinuableStartSpec(
            parent=parent, provider="local", prompt="hi", label="w", model="planner"
        )
    )
    assert rt.wait_idle(20)
    calls = [FakeCall("send_email", {"n": i}) for i in range(12)]
    calls += [
        FakeCall("start_agent", {"prompt": f"p{i}", "label": f"kid{i}", "model": "echo"})
        for i in range(6)
    ]
    fake.script(Answer(tool_calls=calls), Answer(content="never"))
    try:
        rt.subagents.followup(parent, cid, "go")
        assert running.wait(20)  # the first eight run, and wait
        rt.subagents.interrupt(cid, UserAuthority(parent.session_id))
    finally:
        gate.release()
    assert rt.wait_idle(30)
    assert rt.sessions.turn_ends(cid)[-1].stop_reason == "cancelled"
    assert len(started) == PARALLEL_TOOL_CALLS and not any(late for _, late in started)
    assert rt.subagents.list_children(cid).rows == ()
