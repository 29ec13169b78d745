"""A refusal (HTTP 4xx/5xx) whose body does not end, and an error in a whole answer,
over a real socket on both backends. A refusal's body is read until the request's
deadline, never past it: the turn fails with the refusal's status (or retries it, as
its status says), the client hangs up, and the agent takes its next message (R-ERR-1:
a typed error, nothing hangs)."""

from __future__ import annotations

import pytest
from model_kit import register, run_turn
from subagents.actors import Runtime
from subagents.actors.testing import Answer, FakeOpenAI


@pytest.mark.parametrize("status", [400, 503])
def test_a_refusal_whose_body_trickles_ends_at_the_timeout(
    rt: Runtime, fake: FakeOpenAI, status: int
) -> None:
    register(rt, fake, timeout=0.5, max_retries=0)
    fake.script(Answer(status=status, error="overloaded", trickle=True))
    agent = rt.spawn("planner")
    agent.followup("go")
    assert agent.wait_idle(20), "the turn waited for a refusal's body that never ends"
    end = rt.sessions.turn_ends(agent.session_id)[-1]
    assert end.stop_reason == "failed"
    assert "MODEL_ERROR" in end.error and f"HTTP {status}" in end.error, end.error
    assert fake.wait_disconnects(1)  # the client hung up on the trickling body
    assert run_turn(rt, agent, "again").output == "echo: again"


def test_a_trickling_refusal_is_retried_as_its_status_says(rt: Runtime, fake: FakeOpenAI) -> None:
    register(rt, fake, timeout=0.5, max_retries=1)
    fake.script(
        Answer(status=429, error="slow down", trickle=True, headers={"retry-after-ms": "1"}),
        Answer(content="second try"),
    )
    agent = rt.spawn("planner")
    agent.followup("go")
    assert agent.wait_idle(20)
    end = rt.sessions.turn_ends(agent.session_id)[-1]
    assert (end.stop_reason, end.output) == ("completed", "second try")
    assert len(fake.requests) == 2


def test_an_error_in_a_whole_answers_body_is_not_said_to_be_in_a_stream(
    rt: Runtime, fake: FakeOpenAI
) -> None:
    """A 200 whose JSON body is an ``{"error": ...}`` (some compatible servers answer
    so): ``MODEL_ERROR`` naming the API's message, and where it came (R-ERR-1)."""
    register(rt, fake, stream=False)
    body = b'{"error": {"message": "the backend is gone", "type": "server_error"}}'
    fake.script(Answer(raw=body, headers={"Content-Type": "application/json"}))
    agent = rt.spawn("planner")
    end = run_turn(rt, agent, "go")
    assert end.stop_reason == "failed"
    assert "MODEL_ERROR" in end.error and "the backend is gone" in end.error, end.error
    assert "in its answer" in end.error and "in the stream" not in end.error, end.error
