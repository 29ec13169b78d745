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
