"""A one-shot child cannot delegate in the background: its run ends with the turn
that would start the background run, so the run's result would have nowhere to go
(R-ONE-7: a one-shot run offers no follow-up -- and the run itself was cancelled
with the child). Such a ``delegate`` is refused before anything starts, with a
tool error result the model reads (``INVALID_ARGUMENT``, naming the one-shot
child and what to do instead); a waiting ``delegate`` of the same child runs."""

from __future__ import annotations

import json
from typing import Any

from model_kit import register, run_turn
from subagents.actors import Runtime, Turn
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI
from subagents.protocol import ErrorCode


def test_a_one_shot_child_is_refused_background_delegation(rt: Runtime, fake: FakeOpenAI) -> None:
    ran: list[Any] = []
    rt.models.register("worker", lambda _o: lambda turn: ran.append(turn.content) or "worked")
    register(rt, fake)  # "planner": the one-shot child's model
    boss_runs: list[Any] = []

    def boss(turn: Turn) -> Any:
        run = turn.subagents.delegate("local", "plan it", model="planner")
        boss_runs.append(run)
        return run.output

    rt.models.register("boss", lambda _o: boss)
    background = {"prompt": "in the background", "model": "worker", "background": True}
    fake.script(
        Answer(tool_calls=[FakeCall("delegate", background)]),
        Answer(tool_calls=[FakeCall("delegate", {"prompt": "waited", "model": "worker"})]),
        Answer(content="planned"),
    )
    end = run_turn(rt, rt.spawn("boss"), "go")
    assert (end.stop_reason, end.output) == ("completed", "planned"), end.error
    refused = json.loads(fake.requests[1].messages[-1]["content"])
    assert refused["error"]["code"] == ErrorCode.INVALID_ARGUMENT
    message = refused["error"]["message"]
    assert "one-shot" in message and "background" in message, message
    waited = json.loads(fake.requests[2].messages[-1]["content"])
    assert (waited["stop_reason"], waited["output"]) == ("completed", "worked")
    assert ran == ["waited"]  # the refused run never started
