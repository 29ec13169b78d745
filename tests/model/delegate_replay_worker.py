"""A process the delegate replay test kills in a model turn that delegated to a
one-shot child: ``after`` the child's run completed (the next answer's tool
SIGKILLs it), or ``during`` that run (the child SIGKILLs it in its own turn).

Usage: ``python delegate_replay_worker.py DB BACKEND WHEN MARKS``. Prints the
agent's session id.
"""

from __future__ import annotations

import os
import signal
import sys

from delegate_script import CHILD, counter, responder
from subagents.actors import Runtime, get_backend, openai_chat
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI

DB, BACKEND, WHEN, MARKS = sys.argv[1:5]

with FakeOpenAI(api_key="k", responder=responder(Answer(tool_calls=[FakeCall("boom")]))) as fake:
    rt = Runtime(DB, backend=get_backend(BACKEND))

    def die(*_args: object) -> None:
        rt.sessions.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    rt.tools.register("boom", die)
    child = counter(MARKS, die) if WHEN == "during" else counter(MARKS)
    rt.models.register(CHILD, lambda _o: child)
    rt.models.register("m", openai_chat("gpt-test", base_url=fake.base_url, api_key="k"))
    agent = rt.spawn("m", label="root")
    print(agent.session_id, flush=True)
    agent.followup("count something")
    agent.wait_idle(30)
    sys.exit(3)  # not killed
