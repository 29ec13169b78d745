"""A worker of ``test_spawn_race.py``: spawns one well-known session on a shared
SQLite file when told to.

Usage::

    python spawn_worker.py DB SESSION NAME DURABILITY BACKEND

Opens the runtime, prints ``ready``, and waits for a line on stdin (the test
releases every worker at once). Then ``spawn(session_id=SESSION)``: on success
it follows the agent up with ``hello-NAME``, waits for its turn and prints
``spawned``; refused, it prints ``refused CODE``. Closes, prints ``closed``.
"""

from __future__ import annotations

import sys

from subagents.actors import Runtime
from subagents.protocol import SubagentError


def main() -> None:
    db, session, name, durability, backend = sys.argv[1:6]
    with Runtime(db, backend=backend, durability=durability) as rt:
        rt.models.register("echo-model", lambda _o: lambda turn: turn.content)
        print("ready", flush=True)
        sys.stdin.readline()
        try:
            agent = rt.spawn("echo-model", session_id=session)
        except SubagentError as exc:
            print("refused", exc.code, flush=True)
        else:
            agent.followup(f"hello-{name}")
            assert agent.wait_idle(30)
            print("spawned", flush=True)
    print("closed", flush=True)


if __name__ == "__main__":
    main()
