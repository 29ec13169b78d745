"""A process SIGKILLed while a model agent's background ``delegate`` runs are
under way (see :mod:`background_script`: a fast run and a slow one).

``SHAPE``:

* ``root``: a top-level agent's turn started both runs and ended; the process
  dies at once -- no result came, nothing waits in the agent's inbox;
* ``child``: the same, the agent a continuable child (label ``kid``) of a
  top-level agent (model ``root``) that started it;
* ``delivering``: a top-level agent's fast run completed (its child's end is in
  the store) and the process dies as the run's result is being committed to the
  agent's inbox -- the result never reaches it.

Usage: ``python promise_worker.py DB BACKEND SHAPE TTL`` (``TTL``: the lease ttl,
so the process's leases lapse soon after it died). Prints the session id of the
agent that started the runs.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from background_script import FAST, SLOW, fast, responder, slow
from subagents.actors import Runtime, get_backend, openai_chat
from subagents.actors.testing import FakeOpenAI
from subagents.protocol import MessageEvent, TurnEnd

DB, BACKEND, SHAPE, TTL = sys.argv[1:5]
backend = get_backend(BACKEND)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def root(turn: Any) -> str:
    turn.subagents.start_continuable("local", "start both", label="kid", model="m")
    return "started kid"


def stored_turns(rt: Runtime, sid: Any) -> int:
    """The turns of ``sid`` whose end is in the store."""
    return sum(isinstance(r.event, TurnEnd) for r in rt.store.read(sid))


with FakeOpenAI(api_key="k", responder=responder()) as fake:
    rt = Runtime(DB, backend=backend, lease_ttl=float(TTL))
    gate = backend.event()  # the fast child answers once it opens
    rt.models.register(FAST, lambda _o: fast(gate))
    rt.models.register(SLOW, lambda _o: slow)
    rt.models.register("m", openai_chat("gpt-test", base_url=fake.base_url, api_key="k"))
    rt.models.register("root", lambda _o: root)
    if SHAPE == "delivering":
        accept = rt.sessions.accept

        def dying(session_id: Any, events: Any, *args: Any, **kwargs: Any) -> Any:
            for event in events:
                if isinstance(event, MessageEvent) and "delegate_result" in str(event.content):
                    rt.sessions.flush()  # the fast child's end is stored
                    die()
            return accept(session_id, events, *args, **kwargs)

        rt.sessions.accept = dying  # type: ignore[method-assign]
    if SHAPE == "child":
        top = rt.spawn("root", label="root")
        top.followup("go")
        assert top.wait_idle(30)
        (row,) = rt.subagents.list_children(top.session_id).rows
        sid = row.id
    else:
        agent = rt.spawn("m", label="root")
        sid = agent.session_id
        agent.followup("start both")
    print(sid, flush=True)
    deadline = time.monotonic() + 60
    # The turn that started both runs ended (polled: only the store can say).
    while stored_turns(rt, sid) < 1:
        assert time.monotonic() < deadline, "the runs' turn did not end"
        rt.sessions.flush()
        backend.sleep(0.05)  # (its greenlets run meanwhile)
    rt.sessions.flush()
    if SHAPE == "delivering":
        gate.set()  # the fast run completes; its delivery dies
        backend.sleep(60)
    die()
