"""A process whose model agent started two background ``delegate`` runs (see
:mod:`background_script`) and ended its turn; then the fast run's result is
delivered -- ``ran``: its turn ended; ``delivered``: accepted, its turn under way
(the model request for it SIGKILLs the process) -- while the slow run still runs,
and the process stops: ``kill`` (SIGKILL) or ``close`` (``Runtime.close()``, a
clean exit).

Usage: ``python background_worker.py DB BACKEND STOP WHEN``. Prints the agent's
session id.
"""

from __future__ import annotations

import os
import signal
import sys

from background_script import FAST, SLOW, fast, responder, slow
from subagents.actors import Runtime, get_backend, openai_chat
from subagents.actors.testing import FakeOpenAI

DB, BACKEND, STOP, WHEN = sys.argv[1:5]
backend = get_backend(BACKEND)


def die(*_args: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


with FakeOpenAI(api_key="k", responder=responder(die if WHEN == "delivered" else None)) as fake:
    rt = Runtime(DB, backend=backend)
    gate = backend.event()  # the fast child answers once the first turn is stored
    rt.models.register(FAST, lambda _o: fast(gate))
    rt.models.register(SLOW, lambda _o: slow)
    rt.models.register("m", openai_chat("gpt-test", base_url=fake.base_url, api_key="k"))
    agent = rt.spawn("m", label="root")
    print(agent.session_id, flush=True)
    agent.followup("start both")
    assert agent.wait_idle(30)  # its turn ended: both runs are running
    rt.sessions.flush()
    gate.set()
    assert fake.wait_requests(3, 30)  # the fast result's turn asks its model
    assert agent.wait_idle(30)  # (ran: that turn ended)
    rt.sessions.flush()
    if STOP == "kill":
        die()
    rt.close()
