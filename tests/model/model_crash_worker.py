"""A process the history test kills while its model turn, holding a steered
message, waits for its second model request.

Usage: ``python model_crash_worker.py DB BACKEND DURABILITY``. Prints the
agent's session id, then SIGKILLs itself once the second request is in flight.
"""

from __future__ import annotations

import os
import signal
import sys

from subagents.actors import Runtime, get_backend, openai_chat
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI

DB, BACKEND, DURABILITY = sys.argv[1:4]
backend = get_backend(BACKEND)
reached, go = backend.event(), backend.event()


def hold(turn: object) -> str:
    """Wait for the test's steer."""
    reached.set()
    go.wait(30)
    return "held"


with FakeOpenAI(api_key="k") as fake:
    rt = Runtime(DB, backend=backend, durability=DURABILITY)
    rt.tools.register("hold", hold)
    rt.models.register("m", openai_chat("gpt-test", base_url=fake.base_url, api_key="k"))
    agent = rt.spawn("m", label="victim")
    print(agent.session_id, flush=True)
    fake.script(
        Answer(tool_calls=[FakeCall("hold")]),
        Answer(content="never sent", stall=True),
    )
    agent.followup("original")
    assert reached.wait(30)
    assert agent.followup("steered", steer=True).outcome == "steered"
    go.set()  # the tool round ends; the safe point takes the steered message
    assert fake.wait_requests(2)
    rt.sessions.flush()
    os.kill(os.getpid(), signal.SIGKILL)
