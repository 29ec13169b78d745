"""Flushes waiting for the write-behind writer return once their own writes are in,
whatever order they came in (the durability contract of ``flush``:
``docs/durability.md``). The writer keeps them in a heap by ticket, so a drain
reads only the ones it wakes: closing a million resident children waits on a
million tickets, and a list scanned after every batch made that quadratic."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend


def test_flushes_waiting_in_any_order_return_once_their_writes_are_in(
    backend: Backend, tmp_path: Path
) -> None:
    """Six agents' turns are written behind while another connection holds the
    database's write lock; two flushes of each session then wait, the newest
    writes' first (tickets out of order, and equal in pairs). Once the lock goes,
    every flush returns, each agent's turn is in the store, and no waiter is left."""
    db = tmp_path / "w.db"
    with Runtime(str(db), backend=backend, durability="relaxed") as rt:
        rt.models.register("w", lambda _o: lambda turn: turn.content)
        agents = [rt.spawn("w") for _ in range(6)]
        rt.sessions.flush()
        writer: Any = rt.sessions._writer
        lock = sqlite3.connect(db, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # the writer's next batch waits for it
        try:
            for i, agent in enumerate(agents):
                agent.followup(f"m{i}")
                assert agent.wait_idle(10)
            tasks = [
                rt.backend.spawn(rt.sessions.flush, agent.session_id, timeout=30)
                for agent in reversed(agents)
                for _ in range(2)
            ]
            rt.backend.sleep(0)
            deadline = 200
            while len(writer._waiters) < len(tasks) and deadline:
                rt.backend.sleep(0.01)
                deadline -= 1
            assert len(writer._waiters) == len(tasks)
        finally:
            lock.execute("COMMIT")
            lock.close()
        for task in tasks:
            assert task.join(30) and task.exception is None
        assert writer._waiters == []
        for i, agent in enumerate(agents):
            ends = rt.sessions.persistence.read(agent.session_id)
            assert any(getattr(r.event, "output", None) == f"m{i}" for r in ends)
