"""A top-level agent spawned by model name with an ``output_schema`` keeps it when
it is resumed -- after a crash, or a cold resume -- with no schema passed again:
the schema is recorded with the other spawn settings (``agent/options``, as
R-FUP-10 has a continuable child's recorded persona and tool filter apply again),
so the turns run there send it as ``response_format`` and are checked against it
(R-ONE-9's rule for a run's schema). A record without one, as older runtimes
wrote them, still resumes with no schema."""

from __future__ import annotations

from typing import Any

from model_kit import register, run_turn
from subagents.actors import Runtime
from subagents.actors.testing import Answer, FakeOpenAI

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


def test_a_resumed_agent_keeps_its_recorded_output_schema(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake)
    agent = rt.spawn("planner", output_schema=SCHEMA)
    sid = agent.session_id
    fake.script(Answer(content='{"n": 1}'), Answer(content='{"n": 2}'), Answer(content="{}"))
    assert run_turn(rt, agent, "one").structured == {"n": 1}
    agent.dispose()
    again = rt.agents.resume(sid)  # no output_schema passed: the recorded one
    end = run_turn(rt, again, "two")
    assert (end.stop_reason, end.structured) == ("completed", {"n": 2}), end.error
    sent = fake.requests[1].body.get("response_format")
    assert sent == {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA}}
    end = run_turn(rt, again, "three")  # an answer the recorded schema refuses
    assert end.stop_reason == "failed" and "output schema" in str(end.error)


def test_an_agent_spawned_without_a_schema_resumes_without_one(
    rt: Runtime, fake: FakeOpenAI
) -> None:
    register(rt, fake)
    agent = rt.spawn("planner")
    sid = agent.session_id
    (recorded,) = [r.event for r in rt.sessions.read(sid) if r.event.type == "agent/options"]
    assert recorded.payload == {  # the record older runtimes wrote, exactly
        "v": 1,
        "model": "planner",
        "provider": "local",
        "persona": None,
        "tool_filter": None,
    }
    fake.script(Answer(content="free text"), Answer(content="more text"))
    assert run_turn(rt, agent, "one").output == "free text"
    agent.dispose()
    end = run_turn(rt, rt.agents.resume(sid), "two")
    assert (end.stop_reason, end.output, end.structured) == ("completed", "more text", None)
    assert "response_format" not in fake.requests[1].body
