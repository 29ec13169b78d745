"""One group commit's follow-ups look behind their run once (R-FUP-1, R-FUP-5): the
store says which places a transaction wrote for the session in one statement
(``Accepted.run``), all this activation's, so of the producers one commit
answered only the first back looks for messages nobody took -- in whatever
order they come back -- and a message committed between two runs still runs
before the run after it."""

from __future__ import annotations

from typing import Any

import pytest
from durability_kit import looked_once, until
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import new_message_id, trusted_message

FOLLOWERS = 8


@pytest.mark.parametrize("round_", range(5))
def test_the_followups_of_one_group_commit_look_once_whatever_order_they_return_in(
    backend: Backend, db: str, round_: int
) -> None:
    """R-FUP-5: follow-up ``L`` leads a group commit, held in its transaction while
    ``F1``..``F8`` queue behind it, with ``u`` -- a message committed for nobody,
    as another process's ``send`` is -- between ``F3`` and ``F4``. The next
    transaction writes ``F1``-``F3`` in one statement, ``u``, then ``F4``-``F8``
    in another. The callers come back in an order that leaves a gap before each
    of ``F4``, ``F6``, ``F8``: each of them looked, reading the untaken rows
    (quadratic in the queue with 16 producers). Now ``F4`` looks once, behind
    its run, and takes ``u`` first; everybody else finds its place known. Each
    runs once, ``u`` before every follow-up committed after it."""
    names = [f"F{i}" for i in range(1, FOLLOWERS + 1)]
    gates = {name: Gate(name) for name in ["L", *names]}
    held = Gate("transaction")
    with Runtime(db, backend=backend) as rt:
        agent = looked_once(rt)
        sid = agent.session_id
        sessions: Any = rt.sessions
        sessions.flush(sid, timeout=10)  # m0's turn's writes: none left to join a batch
        store = sessions.persistence
        committer = store._committer
        accept, untaken, execute = sessions.accept, sessions.untaken, committer._execute
        reads: list[tuple[Any, ...]] = []
        holding = True  # until L's acceptance, alone in its transaction

        def held_execute(batch: Any) -> None:
            nonlocal holding
            if holding and any(getattr(r.op, "session_id", None) == sid for r in batch):
                holding = False
                held.pass_through()
            execute(batch)

        def gated_accept(*args: Any, **kw: Any) -> Any:
            done = accept(*args, **kw)
            gates[args[1][0].content].pass_through()
            return done

        def counted_untaken(*args: Any, **kw: Any) -> Any:
            reads.append(args)
            return untaken(*args, **kw)

        committer._execute = held_execute
        sessions.accept, sessions.untaken = gated_accept, counted_untaken
        spawned = {"L": rt.backend.spawn(lambda: agent.followup("L"), name="L")}
        assert held.wait_reached(10)  # L's batch (L alone) is in its transaction
        queued = 0

        def queue(name: str, call: Any) -> None:
            nonlocal queued
            spawned[name] = rt.backend.spawn(call, name=name)
            queued += 1
            assert until(rt, lambda: committer.pending == queued, timeout=10)

        u = trusted_message(new_message_id(), "u", None)
        for name in names:
            queue(name, lambda name=name: agent.followup(name))
            if name == "F3":
                queue("u", lambda: rt.backend.run_blocking(store.accept, sid, [u], now=1.0))
        held.release()
        order = ["F4", "F6", "F8", "F1", "F2", "F3", "F5", "F7", "L"]
        for name in order:
            assert gates[name].wait_reached(10)
            gates[name].release()
            task = spawned[name]
            assert task.join(10) and task.exception is None, name
        assert spawned["u"].join(10) and spawned["u"].exception is None
        assert agent.wait_idle(10)
        assert reads == [(sid, 1)]  # F4's look, past m0's place; nobody else's
        outputs = [e.output for e in rt.sessions.turn_ends(sid)]
        assert outputs == ["m0", "u", *order]
