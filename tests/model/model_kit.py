"""Helpers of the model tests: register an ``openai_chat`` model on the fake, run a turn."""

from __future__ import annotations

from typing import Any

from subagents.actors import AbortController, Runtime, SubagentStartRequest, openai_chat
from subagents.actors.testing import FakeOpenAI

__all__ = ["register", "run_structured_start", "run_turn"]


def register(rt: Runtime, fake: FakeOpenAI, name: str = "planner", **kw: Any) -> None:
    """Register model ``name``: ``openai_chat`` against ``fake`` (its test key)."""
    kw.setdefault("api_key", "test-key")
    rt.models.register(name, openai_chat("gpt-test", base_url=fake.base_url, **kw))


def run_turn(rt: Runtime, agent: Any, content: Any) -> Any:
    """Follow ``agent`` up with ``content``; the ``turn/end`` of the turn it ran."""
    agent.followup(content)
    assert agent.wait_idle(20)
    return rt.sessions.turn_ends(agent.session_id)[-1]


def run_structured_start(rt: Runtime, schema: Any) -> tuple[Any, Any]:
    """A one-shot run of model ``planner`` with ``schema`` under a new top-level
    agent: its result, and the error its child's turn recorded."""
    request = SubagentStartRequest(
        parent=rt.spawn("echo"),
        prompt="x",
        model="planner",
        signal=AbortController().signal,
        output_schema=schema,
    )
    run = rt.subagents.start("local", request)
    try:
        result = run.result.get(timeout=20)
    finally:
        run.dispose()
    return result, rt.sessions.turn_ends(run.id)[-1].error
