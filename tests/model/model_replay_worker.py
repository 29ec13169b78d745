"""A process the replay test kills in a model turn after its ``start_agent`` and
``send_message`` calls ran (the third answer's tool SIGKILLs it).

Usage: ``python model_replay_worker.py DB BACKEND``. Prints the agent's session id.
"""

from __future__ import annotations

import os
import signal
import sys

from replay_script import CHILD, responder
from subagents.actors import Runtime, get_backend, openai_chat
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI

DB, BACKEND = sys.argv[1:3]

with FakeOpenAI(api_key="k", responder=responder(Answer(tool_calls=[FakeCall("boom")]))) as fake:
    rt = Runtime(DB, backend=get_backend(BACKEND))

    def boom(turn: object) -> None:
        rt.sessions.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    rt.tools.register("boom", boom)
    rt.models.register(CHILD, lambda _o: lambda turn: "noted")
    rt.models.register("m", openai_chat("gpt-test", base_url=fake.base_url, api_key="k"))
    agent = rt.spawn("m", label="root")
    print(agent.session_id, flush=True)
    agent.followup("start a watcher")
    agent.wait_idle(30)
    sys.exit(3)  # not killed
