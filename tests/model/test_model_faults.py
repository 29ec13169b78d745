"""``openai_chat`` where a model, a tool or a setting misbehaves, on both backends
(issue 16 points 2-3; R-STEER-*, R-CAP-4): slow models never starve the store's
I/O on gevent, a request's timeout bounds a trickling stream, a steered message is
never lost to the tool-round limit, a tool's lone surrogate reaches the model as
U+FFFD, settings that would fail every turn are refused when given, a model child
honours its output schema, and the runtime's tools are the model's tools too."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from model_kit import register, run_turn
from subagents.actors import (
    AbortController,
    AgentOptions,
    ContinuableStartSpec,
    ModelTool,
    Runtime,
    SubagentStartRequest,
    ToolDispatcher,
    openai_chat,
)
from subagents.actors._kernel._backend import Backend
from subagents.actors._model._openai import PARALLEL_TOOL_CALLS, REDELIVERED_NOTE
from subagents.actors._model._wire import encode_body
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI, Gate
from subagents.protocol import ErrorCode, SubagentError


def _users(request: Any) -> list[Any]:
    return [m["content"] for m in request.messages if m["role"] == "user"]


def test_slow_models_leave_the_store_its_threads(
    backend: Backend, fake: FakeOpenAI, tmp_path: Any
) -> None:
    """Twelve turns waiting on their model (more than the ten workers of a gevent
    hub's threadpool) and an agent on the same SQLite store still spawns and runs."""
    with Runtime(str(tmp_path / "db.sqlite"), backend=backend) as rt:
        register(rt, fake)
        fake.script(*[Answer(content="late", stall=True) for _ in range(12)])
        thinkers = [rt.spawn("planner") for _ in range(12)]
        try:
            for agent in thinkers:
                agent.followup("think")
            assert fake.wait_requests(12)  # all twelve are waiting at once
            done = backend.event()
            outputs: list[Any] = []

            def other() -> None:
                echo = rt.spawn("echo")
                outputs.append(run_turn(rt, echo, "still served").output)
                done.set()

            backend.spawn(other)
            assert done.wait(15), "the store's I/O waited for the models"
            assert outputs == ["still served"]
        finally:
            fake.release()
        for agent in thinkers:
            assert agent.wait_idle(20)


def test_a_trickling_stream_ends_at_the_timeout(rt: Runtime, fake: FakeOpenAI) -> None:
    """A server that keeps a stream alive with comments and never answers: the
    request's ``timeout`` bounds the whole answer, not each read."""
    register(rt, fake, timeout=0.3, max_retries=0)
    fake.script(Answer(content="never", trickle=True))
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert end.stop_reason == "failed" and "TIMEOUT" in end.error
    assert not fake._released.is_set()  # it was still trickling


def test_a_message_steered_into_the_last_round_runs_as_the_next_turn(
    rt: Runtime, fake: FakeOpenAI
) -> None:
    """R-STEER: a turn that ends on the tool-round limit takes no steered message in
    its last round; the message runs as the next turn (and the last round's tools
    do not run for nothing)."""
    register(rt, fake, max_tool_rounds=1)
    ran: list[str] = []
    rt.tools.register("mark", lambda turn: ran.append("mark") or "marked")
    fake.script(
        Answer(tool_calls=[FakeCall("mark")]),
        Answer(tool_calls=[FakeCall("mark")], stall=True),  # the last round allowed
        Answer(content="done with the hotel"),
    )
    agent = rt.spawn("planner")
    agent.followup("plan the trip")
    assert fake.wait_requests(2)
    assert agent.followup("and book a hotel", steer=True).outcome == "steered"
    fake.release()
    assert agent.wait_idle(20)
    ends = rt.sessions.turn_ends(agent.session_id)
    assert [e.stop_reason for e in ends] == ["failed", "completed"]
    assert "MODEL_ERROR" in ends[0].error and "rounds" in ends[0].error
    assert ends[1].output == "done with the hotel"
    assert _users(fake.requests[2])[-1] == "and book a hotel"
    assert ran == ["mark"]  # the second round's call was not run


def test_a_tools_lone_surrogate_reaches_the_model_replaced(rt: Runtime, fake: FakeOpenAI) -> None:
    """A tool result carrying a lone surrogate is sent as U+FFFD (httpx would refuse
    to encode it and fail the turn untyped); a pair split in two code points joins."""
    broken = ModelTool("returns broken text", {"type": "object"}, fn=lambda turn: "ab\ud83d")
    paired = ModelTool("returns a split pair", {"type": "object"}, fn=lambda turn: "\ud83d\ude00")
    tools = ToolDispatcher(extra={"broken": broken, "paired": paired})
    register(rt, fake, tools=tools)
    fake.script(
        Answer(tool_calls=[FakeCall("broken"), FakeCall("paired")]), Answer(content="read it")
    )
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert (end.stop_reason, end.output) == ("completed", "read it")
    results = [m["content"] for m in fake.requests[1].messages if m["role"] == "tool"]
    assert results == ["ab\ufffd", "\U0001f600"]


def test_encode_body() -> None:
    assert encode_body({"a": "\u00e9\U0001f600"}) == '{"a": "\u00e9\U0001f600"}'.encode()
    assert json.loads(encode_body({"a": "x\udc80y"})) == {"a": "x\ufffdy"}
    for bad in ({"a": math.nan}, {"a": object()}):
        with pytest.raises(SubagentError) as err:
            encode_body(bad)
        assert err.value.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout": math.nan},
        {"timeout": math.inf},
        {"timeout": 0},
        {"timeout": 1e300},
        {"timeout": 10**400},
        {"timeout": "10"},
        {"max_retries": math.inf},
        {"max_retries": 1.5},
        {"max_tool_rounds": True},
        {"headers": {"X-Trace": 5}},
        {"headers": ["X-Trace"]},
        {"temperature": math.nan},
        {"temperature": Decimal("0.5")},
        {"metadata": {"k": {1, 2}}},
        {"stream": "no"},  # truthy: it streamed
        {"stream": None},
        {"messages": [{"role": "user", "content": "x"}]},  # dropped: the turn's are sent
        {"stream_options": {"include_usage": False}},  # replaced when streaming
    ],
    ids=lambda v: repr(v)[:60],
)
def test_settings_that_would_fail_every_turn_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(SubagentError) as err:
        openai_chat("m", api_key="k", base_url="http://127.0.0.1:1/v1", **kwargs)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT


def _schema_run(rt: Runtime, schema: Any) -> Any:
    host = rt.spawn("echo", label="host")
    run = rt.subagents.start(
        "local",
        SubagentStartRequest(
            parent=host,
            prompt="answer",
            model="planner",
            output_schema=schema,
            signal=AbortController().signal,
        ),
    )
    try:
        return run.result.get(timeout=20)
    finally:
        run.dispose()


def test_a_model_child_answers_in_its_output_schema(rt: Runtime, fake: FakeOpenAI) -> None:
    """R-CAP-4: the schema goes to the model as its response format, and the JSON
    text it answers with is the structured output."""
    register(rt, fake)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fake.script(Answer(content='{"a": 1}'), Answer(content='{"b": 2}'))
    result = _schema_run(rt, schema)
    assert (result.stop_reason, result.structured) == ("completed", {"a": 1})
    sent = fake.requests[0].body["response_format"]
    assert sent == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    wrong = _schema_run(rt, schema)
    assert (wrong.stop_reason, wrong.structured) == ("failed", None)


def test_a_string_schema_takes_the_text(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake)
    fake.script(Answer(content="42"))
    result = _schema_run(rt, {"type": "string"})
    assert (result.stop_reason, result.structured) == ("completed", "42")
    assert "response_format" not in fake.requests[0].body


def test_runtime_tools_are_the_models_tools(rt: Runtime, fake: FakeOpenAI) -> None:
    """The runtime's tools are shown to a model agent, described from their
    signatures, called through ``turn.call_tool`` (its filter decides)."""

    def search(turn: Any, query: str, limit: int = 3) -> str:
        """Search the corpus.

        Longer text the model does not need."""
        return f"{limit} results for {query}"

    rt.tools.register("search", search)
    rt.tools.register("delete_everything", lambda turn: "gone")
    register(rt, fake)
    fake.script(
        Answer(tool_calls=[FakeCall("search", {"query": "actors"})]),
        Answer(content="found"),
        Answer(tool_calls=[FakeCall("delete_everything")]),
        Answer(content="refused"),
    )
    agent = rt.spawn("planner")
    assert run_turn(rt, agent, "look").output == "found"
    first = fake.requests[0]
    assert first.tool_names[-2:] == ["search", "delete_everything"]
    shown = next(t["function"] for t in first.body["tools"] if t["function"]["name"] == "search")
    assert shown["description"] == "Search the corpus."
    assert shown["parameters"] == {
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query"],
        "additionalProperties": False,
    }
    assert [m["content"] for m in fake.requests[1].messages if m["role"] == "tool"] == [
        "3 results for actors"
    ]
    narrow = rt.spawn("planner", options=AgentOptions(tool_filter=("search",)))
    assert run_turn(rt, narrow, "try").output == "refused"
    assert "delete_everything" not in fake.requests[2].tool_names
    refusal = json.loads(
        next(m["content"] for m in fake.requests[3].messages if m["role"] == "tool")
    )
    assert refusal["error"]["code"] == "INVALID_ARGUMENT"


def test_a_setup_contributions_tool_is_a_model_tool(rt: Runtime, fake: FakeOpenAI) -> None:
    """R-SETUP-7: a tool a setup contribution put in a continuable child's scope is
    shown to the child's model and runs there."""
    notes: list[str] = []

    def give_a_notebook(scope: Any) -> None:
        scope.add_tool("note", lambda turn, text: notes.append(text) or len(notes))

    rt.subagents.register_continuable_setup(give_a_notebook)
    register(rt, fake)
    fake.script(
        Answer(tool_calls=[FakeCall("note", {"text": "milk"})]),
        Answer(content="noted"),
    )
    parent = rt.spawn("echo", label="parent")
    child_id, _ = rt.subagents.start_continuable(
        ContinuableStartSpec(
            parent=parent, provider="local", prompt="remember milk", label="notes", model="planner"
        )
    )
    assert fake.wait_requests(2)
    assert rt.wait_idle(20)
    assert "note" in fake.requests[0].tool_names
    assert notes == ["milk"]
    assert rt.sessions.turn_ends(child_id)[-1].output == "noted"


def test_deeply_nested_arguments_are_refused_as_invalid(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake)
    fake.script(Answer(tool_calls=[FakeCall("list_agents", "[" * 100_000)]), Answer(content="ok"))
    agent = rt.spawn("planner")
    assert run_turn(rt, agent, "go").output == "ok"
    tool = next(m["content"] for m in fake.requests[1].messages if m["role"] == "tool")
    assert json.loads(tool)["error"]["code"] == "INVALID_ARGUMENT"


WORKER = Path(__file__).with_name("model_crash_worker.py")


def _crashed(db: str, backend: Backend, durability: str) -> str:
    """Run the crash worker on ``db`` (it SIGKILLs itself mid-turn); the session id."""
    done = subprocess.run(
        [sys.executable, str(WORKER), db, backend.name, durability],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    return done.stdout.split()[0]


def test_a_cut_short_turn_is_run_again_without_its_messages_twice(
    backend: Backend, tmp_path: Any
) -> None:
    """R-STEER, R-DUR: a model turn a crash cut short (SIGKILL while it held a
    steered message) runs again: the model sees the original message once and not
    the steered one, which runs after it as a turn of its own, once."""
    db = str(tmp_path / "db.sqlite")
    sid = _crashed(db, backend, "strict")
    with FakeOpenAI(api_key="k") as fake, Runtime(db, backend=backend) as rt:
        register(rt, fake, name="m", api_key="k")
        fake.script(Answer(content="original done"), Answer(content="steered done"))
        rt.agents.resume(sid)
        assert rt.wait_idle(20)
        assert [_users(r) for r in fake.requests] == [["original"], ["original", "steered"]]
        # Both were taken before the crash (the cut turn, the message steered into
        # it): each is told it runs again, in its one system message, first.
        for r in fake.requests:
            systems = [i for i, m in enumerate(r.messages) if m["role"] == "system"]
            assert systems == [0] and r.messages[0]["content"].endswith(REDELIVERED_NOTE)
        assert fake.requests[1].messages[-2] == {"role": "assistant", "content": "original done"}
        ends = rt.sessions.turn_ends(sid)
        assert [e.stop_reason for e in ends] == ["failed", "completed", "completed"]


def test_parallel_tool_calls_run_eight_at_a_time(
    rt: Runtime, fake: FakeOpenAI, backend: Backend
) -> None:
    """An answer with twenty tool calls runs them all, at most eight at once (it
    was a thread or greenlet each)."""
    lock = backend.lock()
    inside: list[int] = [0, 0]  # now, most
    eight, gate = backend.event(), Gate("tools")

    def work(turn: Any, n: int) -> int:
        with lock:
            inside[0] += 1
            inside[1] = max(inside)
            if inside[0] == PARALLEL_TOOL_CALLS:
                eight.set()
        gate.pass_through()
        with lock:
            inside[0] -= 1
        return n

    rt.tools.register("work", work)
    register(rt, fake)
    fake.script(
        Answer(tool_calls=[FakeCall("work", {"n": n}) for n in range(20)]),
        Answer(content="all done"),
    )
    agent = rt.spawn("planner")
    agent.followup("go")
    assert eight.wait(10)
    backend.sleep(0.2)  # room for a ninth to start, were it allowed to
    assert inside[1] == PARALLEL_TOOL_CALLS
    gate.release()
    assert agent.wait_idle(20)
    assert rt.sessions.turn_ends(agent.session_id)[-1].output == "all done"
    results = [m["content"] for m in fake.requests[1].messages if m["role"] == "tool"]
    assert results == [str(n) for n in range(20)]


def test_runtime_tools_take_any_parameter_names(rt: Runtime, fake: FakeOpenAI) -> None:
    """A tool parameter called ``name`` (or ``turn``...) reaches the tool (it met the
    registry's own ``name``), and positional-only ones keep their places (one left
    out before a given one takes its default)."""

    def greet(turn: Any, name: str, extra: str = "!") -> str:
        return f"hello {name}{extra}"

    def pos(turn: Any, a: int = 1, b: int = 2, /) -> str:
        return f"a={a} b={b}"

    rt.tools.register("greet", greet)
    rt.tools.register("pos", pos)
    register(rt, fake)
    calls = [FakeCall("greet", {"name": "bob"}), FakeCall("pos", {"b": 5}), FakeCall("pos")]
    fake.script(Answer(tool_calls=calls), Answer(content="ok"))
    agent = rt.spawn("planner")
    assert run_turn(rt, agent, "go").output == "ok"
    results = [m["content"] for m in fake.requests[1].messages if m["role"] == "tool"]
    assert results == ["hello bob!", "a=1 b=5", "a=1 b=2"]


def test_under_relaxed_durability_a_cut_short_turns_messages_stay(
    backend: Backend, tmp_path: Path
) -> None:
    """Relaxed durability runs nothing again after a crash: the messages of the
    turn it cut short stay in the conversation (they vanished from it), before the
    next message."""
    db = str(tmp_path / "db.sqlite")
    sid = _crashed(db, backend, "relaxed")
    with (
        FakeOpenAI(api_key="k") as fake,
        Runtime(db, backend=backend, durability="relaxed") as rt,
    ):
        register(rt, fake, name="m", api_key="k")
        fake.script(Answer(content="third done"))
        agent = rt.agents.resume(sid)
        assert run_turn(rt, agent, "third").output == "third done"
        assert [_users(r) for r in fake.requests] == [["original", "steered", "third"]]
