"""A worker process of ``test_multiprocess.py``: one runtime on a shared SQLite file.

Usage::

    python mp_worker.py send DB SESSION NAME COUNT TOTAL MARKS BACKEND TTL
    python mp_worker.py hold DB SESSION - - - MARKS BACKEND TTL
    python mp_worker.py pace DB SESSION NAME COUNT - MARKS BACKEND TTL
    python mp_worker.py accept DB SESSION - COUNT - MARKS BACKEND TTL
    python mp_worker.py stall DB SESSION NAME COUNT - MARKS BACKEND TTL
    python mp_worker.py tree DB - - COUNT - MARKS BACKEND TTL
    python mp_worker.py leave DB SESSION - COUNT - MARKS BACKEND TTL
    python mp_worker.py resume DB SESSION - - - MARKS BACKEND TTL

``send``: sends COUNT messages ``NAME-i`` to SESSION with ``agents.send``,
printing each id it was given, then waits until the session's log has TOTAL
completed turns (whichever process runs them) and closes.

``accept``: resumes SESSION, whose first turn (``first``) then never ends, and
follows it up with ``m0`` .. ``m{COUNT-1}`` (accepted, queued behind it); prints
``ready`` and waits to be killed.

``leave``: as ``accept``, then closes its runtime instead of waiting: the
first turn is cancelled, and what it accepted stays in the session's inbox.

``resume``: resumes SESSION, prints ``resumed`` (or the error's code), waits
until it is idle and closes.

``tree``: spawns a top-level ``mark`` agent and a continuable child of it
(model ``stuck``) whose first turn, its prompt ``m0``, never ends; follows the
child up with ``m1`` .. ``m{COUNT}`` by the parent; prints ``ready PARENT CHILD``
and waits to be killed.

With ``SUBAGENTS_TEST_HOST`` set, the worker's lease holder names that host
instead of this one (a second machine, for the PostgreSQL tests).

``pace``: sends ``NAME-i`` to SESSION with ``agents.send``, COUNT of them, one
every 0.05 s, printing each id (a holder elsewhere is rung at that pace), and
closes. Its runtime adopts nothing.

``stall``: resumes SESSION and follows it up with ``m0`` .. ``m{COUNT-1}``, each
turn 0.2 s of work its signal does not cut; prints ``ready``, then ``lost`` once
its agent was disposed (its lease taken over while the test had it stopped).

``hold``: resumes SESSION (taking its lease), prints ``held``, and waits for its
agent to be disposed -- which happens when another process took the lease over
(``LEASE_LOST``); then tries one more follow-up, prints the error code, closes.

The ``mark`` model appends ``start NAME CONTENT`` and ``end NAME CONTENT`` lines
to MARKS around each turn (O_APPEND: lines of concurrent writers never mix), so
the test can see whether two processes' turns ever overlapped.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from subagents.actors import ContinuableStartSpec, Runtime
from subagents.protocol import SessionId, SubagentError, TurnEnd


def _mark(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


def register(rt: Runtime, name: str, marks: str) -> None:
    def factory(_options: Any) -> Any:
        def on_turn(turn: Any) -> Any:
            _mark(marks, f"start {name} {turn.content}")
            rt.backend.sleep(0.002)  # the turn's "work": long enough to overlap if allowed
            _mark(marks, f"end {name} {turn.content}")
            return turn.content

        return on_turn

    rt.models.register("mark", factory, replace=True)


def _completed(rt: Runtime, sid: SessionId) -> int:
    assert rt.store is not None
    return sum(1 for r in rt.store.read(sid) if isinstance(r.event, TurnEnd))


def _fake_host() -> None:
    # SUBAGENTS_TEST_HOST: this worker says it runs on another host (its lease
    # holder id names that host), as a second machine on one PostgreSQL store would.
    host = os.environ.get("SUBAGENTS_TEST_HOST")
    if host:
        from subagents.store import _holders

        _holders._HOST = host


def main(argv: list[str]) -> int:
    _fake_host()
    mode, db, session, name, count, total, marks, backend, ttl = argv
    sid = SessionId(session) if session != "-" else None
    # A pacer only sends: it adopts nothing, so an orphan the test plants is the
    # rung runtime's to find (this one's sweep took it, now and then, under load).
    rt = Runtime(db, backend=backend, lease_ttl=float(ttl), adopt=mode != "pace")
    try:
        register(rt, name, marks)
        if mode == "tree":
            stuck = lambda _o: lambda turn: turn.signal.wait(3600)  # noqa: E731
            rt.models.register("stuck", stuck, replace=True)
            lead = rt.spawn("mark", label="lead")
            spec = ContinuableStartSpec(
                parent=lead, provider="local", prompt="m0", label="kid", model="stuck"
            )
            child, _ = rt.subagents.start_continuable(spec)
            for i in range(1, int(count) + 1):
                rt.subagents.followup(lead, child, f"m{i}")
            print(f"ready {lead.session_id} {child}", flush=True)
            lead.wait_disposed(3600)  # killed before
        elif mode == "send":
            assert sid is not None
            for i in range(int(count)):
                print(rt.agents.send(sid, f"{name}-{i}"), flush=True)
            deadline = time.monotonic() + 60
            while _completed(rt, sid) < int(total):
                if time.monotonic() > deadline:
                    print("timeout", flush=True)
                    return 3
                rt.backend.sleep(0.05)  # polling a store other processes write
        elif mode == "pace":
            assert sid is not None
            for i in range(int(count)):
                print(rt.agents.send(sid, f"{name}-{i}"), flush=True)
                rt.backend.sleep(0.05)  # the pace of the rings, not an ordering
        elif mode in ("accept", "leave"):
            assert sid is not None
            stuck = lambda _o: lambda turn: turn.signal.wait(3600)  # noqa: E731
            rt.models.register("mark", stuck, replace=True)
            agent = rt.agents.resume(sid)
            agent.followup("first")
            for i in range(int(count)):
                agent.followup(f"m{i}")
            print("ready", flush=True)
            if mode == "accept":
                agent.wait_disposed(3600)  # killed before
        elif mode == "resume":
            assert sid is not None
            try:
                resumed = rt.agents.resume(sid)
            except SubagentError as exc:
                print(exc.code, flush=True)
            else:
                print("resumed", flush=True)
                resumed.wait_idle(30)
        elif mode == "stall":
            assert sid is not None

            def slow(_options: Any) -> Any:
                def on_turn(turn: Any) -> Any:
                    _mark(marks, f"start {name} {turn.content}")
                    until = time.monotonic() + 0.2  # work its turn's signal does not cut
                    while time.monotonic() < until:
                        rt.backend.sleep(0.01)
                    return turn.content

                return on_turn

            rt.models.register("mark", slow, replace=True)
            agent = rt.agents.resume(sid)
            for i in range(int(count)):
                agent.followup(f"m{i}")
            print("ready", flush=True)
            agent.wait_disposed(3600)  # its lease taken over while it was stopped
            print("lost", flush=True)
        else:
            assert sid is not None
            agent = rt.agents.resume(sid)
            print("held", flush=True)
            if not agent.wait_disposed(60):
                print("still held", flush=True)
                return 3
            try:
                agent.followup("late")
            except SubagentError as exc:
                print(exc.code, flush=True)
        return 0
    finally:
        rt.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
