"""A worker process of ``test_clock_skew.py``: a runtime whose wall clock is off.

Usage::

    python clock_worker.py hold DB SESSION BACKEND TTL SKEW
    python clock_worker.py resume DB SESSION BACKEND TTL SKEW

``SKEW`` (seconds, may be negative) is added to every ``time.time()`` reading of
this process from before ``subagents`` is imported: this machine's clock runs
that far ahead of (or behind) the other processes', as a second host's would.

``hold``: resumes SESSION (taking its lease) with a ``mark`` model, prints
``held``, then waits for a line on stdin and prints ``kept`` if its agent still
holds the session, ``lost`` if it was disposed (its lease taken over).

``resume``: tries to resume SESSION once and prints ``resumed`` or the error code.
"""

from __future__ import annotations

import os
import sys
import time

_real_time = time.time
_skew = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
time.time = lambda: _real_time() + _skew  # before any module binds it


def main(argv: list[str]) -> int:
    from subagents.actors import Runtime
    from subagents.protocol import SubagentError

    host = os.environ.get("SUBAGENTS_TEST_HOST")
    if host:  # this worker's lease holder names another machine
        from subagents.store import _holders

        _holders._HOST = host
    mode, db, session, backend, ttl, _ = argv
    with Runtime(db, backend=backend, lease_ttl=float(ttl)) as rt:
        rt.models.register("mark", lambda _o: lambda turn: turn.content)
        if mode == "resume":
            try:
                rt.agents.resume(session)
                print("resumed", flush=True)
            except SubagentError as exc:
                print(exc.code, flush=True)
            return 0
        agent = rt.agents.resume(session)
        print("held", flush=True)
        sys.stdin.readline()
        print("lost" if agent.wait_disposed(0) else "kept", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
