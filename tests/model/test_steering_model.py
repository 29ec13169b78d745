"""Steering a model-driven turn (issue 16 point 4) through the fake server.

A message steered while the model is thinking joins the conversation at the next
safe point -- after the tool results, before the next request -- is recorded
inside the turn, and is part of the history the next turn sends. A model can steer
its own children with ``send_message(steer=true)``.
"""

from __future__ import annotations

from typing import Any

from subagents.actors import ContinuableStartSpec, Runtime, openai_chat
from subagents.actors.testing import (
    Answer,
    Block,
    Call,
    FakeCall,
    FakeOpenAI,
    Gate,
    ScriptedBehaviour,
)
from subagents.protocol import MessageEvent


def test_a_steer_joins_the_next_request_and_the_history(rt: Runtime, fake: FakeOpenAI) -> None:
    rt.models.register(
        "planner", openai_chat("gpt-test", base_url=fake.base_url, api_key="test-key")
    )
    fake.script(
        Answer(tool_calls=[FakeCall("list_agents", {}, id="c_1")], stall=True),
        Answer(content="noted both"),
        Answer(content="third"),
    )
    agent = rt.spawn("planner")
    agent.followup("plan the trip")
    assert fake.wait_requests(1)
    steered = agent.followup("and book a hotel", steer=True)
    assert steered.outcome == "steered"
    fake.release()
    assert agent.wait_idle(20)
    second = fake.requests[1].messages
    assert second[-1] == {"role": "user", "content": "and book a hotel"}
    assert second[-2]["role"] == "tool" and second[-2]["tool_call_id"] == "c_1"
    events = [r.event for r in rt.sessions.read(agent.session_id)]
    said = [e.content for e in events if isinstance(e, MessageEvent)]
    assert said == ["plan the trip", "and book a hotel"]
    assert [e.output for e in rt.sessions.turn_ends(agent.session_id)] == ["noted both"]
    agent.followup("next")
    assert agent.wait_idle(20)
    assert fake.requests[2].messages == [
        {"role": "user", "content": "plan the trip"},
        {"role": "user", "content": "and book a hotel"},
        {"role": "assistant", "content": "noted both"},
        {"role": "user", "content": "next"},
    ]


def test_the_model_steers_its_child(rt: Runtime, fake: FakeOpenAI) -> None:
    """``send_message`` with ``steer: true`` reaches the child's running turn and
    tells the model it was ``steered``."""
    gate = Gate("child thinking")
    seen: list[Any] = []

    def take(turn: Any) -> Any:
        seen.extend(m.content for m in turn.steering())
        return "child done"

    rt.models.register("worker", lambda _o: ScriptedBehaviour([Block(gate), Call(take)]))
    rt.models.register(
        "planner", openai_chat("gpt-test", base_url=fake.base_url, api_key="test-key")
    )
    parent = rt.spawn("planner")
    child = rt.subagents.start_continuable(
        ContinuableStartSpec(
            parent=parent, provider="local", prompt="work", label="worker", model="worker"
        )
    )
    assert gate.wait_reached(10)
    fake.script(
        Answer(
            tool_calls=[
                FakeCall(
                    "send_message",
                    {"id": str(child.child_id), "content": "hurry", "steer": True},
                    id="c_1",
                )
            ]
        ),
        Answer(content="sent"),
    )
    parent.followup("tell the worker to hurry")
    assert fake.wait_requests(2)
    gate.release()
    assert rt.wait_idle(20)
    assert seen == ["hurry"]
    tool = fake.requests[1].messages[-1]
    assert tool["role"] == "tool" and '"delivered": "steered"' in tool["content"]


def test_a_close_mid_turn_shows_a_steered_message_once(backend: Any, tmp_path: Any) -> None:
    """A runtime closed while a model turn holds a steered message keeps the turn's
    messages accepted (they run again at the next activation). After a resume the
    model sees each once, where it runs -- the replayed turn's request used to
    hold the steered message too, before the original one."""
    from subagents.actors.testing import FakeCall

    db = str(tmp_path / "c.db")
    gate = Gate("tool")

    def users(request: Any) -> list[Any]:
        return [m["content"] for m in request.messages if m["role"] == "user"]

    with FakeOpenAI(api_key="k") as fake:
        rt = Runtime(db, backend=backend)
        try:
            rt.tools.register("hold", lambda turn: gate.pass_through(turn.signal) or "held")
            rt.models.register("m", openai_chat("g", base_url=fake.base_url, api_key="k"))
            agent = rt.spawn("m", label="victim")
            sid = agent.session_id
            fake.script(Answer(tool_calls=[FakeCall("hold")]), Answer(content="no", stall=True))
            agent.followup("original")
            assert gate.wait_reached(20)
            assert agent.followup("steered", steer=True).outcome == "steered"
            gate.release()
            assert fake.wait_requests(2, 20)  # the second request holds the steered one
            assert users(fake.requests[1]) == ["original", "steered"]
        finally:
            gate.release()
            rt.close()  # cancels the running turn; what it accepted stays
            fake.release()
    with FakeOpenAI(api_key="k") as fake, Runtime(db, backend=backend) as rt:
        rt.models.register("m", openai_chat("g", base_url=fake.base_url, api_key="k"))
        fake.script(Answer(content="original done"), Answer(content="steered done"))
        rt.agents.resume(sid)
        assert rt.wait_idle(30)
        seen = [users(request) for request in fake.requests]
        flat = [content for request in seen for content in request]
        assert seen[0] == ["original"], seen
        assert flat.count("steered") == 1 and "steered" in seen[-1], seen
