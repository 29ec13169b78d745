"""On gevent (unpatched) no greenlet holds a plain lock while it yields to the hub.

A ``threading.Lock`` is then an OS lock: held across a yield -- a blocking store
call run in the hub's threadpool, a wait for a result or for an actor's stop --
it stops the whole thread once another greenlet of it asks for the same lock (the
acquire blocks the thread, and the hub never runs the holder again). Each test
runs real work on a blocking store (SQLite, PostgreSQL: every store call yields)
under :class:`~held_locks.HeldLockWatch`, which fails on the hold itself, whether
or not another greenlet happened to ask during it.
"""

from __future__ import annotations

from typing import Any

import gevent
import gevent.event
import gevent.monkey
import pytest
from held_locks import HeldLockWatch
from listening_child import listening_child
from subagents.actors import ContinuableStartSpec, Runtime, SubagentStartRequest, UserAuthority
from subagents.actors._kernel._signal import AbortSignal
from subagents.actors.testing import Block, Gate, ScriptedBehaviour
from subagents.protocol import ErrorCode, SubagentError
from subagents.store import MemoryStore

pytestmark = [
    pytest.mark.backend_specific,
    pytest.mark.skipif(
        gevent.monkey.is_module_patched("threading"),
        reason="monkey-patched: threading's locks are gevent's, cooperative",
    ),
]


def test_a_run_disposed_while_it_runs_holds_no_lock_across_its_waits(db: str) -> None:
    """R-ONE-11, R-ONE-12 on gevent: ``run.dispose()`` waits for the run's result and
    for the child's stop -- yields to the hub -- holding no plain lock (the local
    provider's release held one across both waits), while another greenlet
    disposes the same run and the main greenlet lists the parent's children."""
    gate = Gate()
    with HeldLockWatch() as watch, Runtime(db, backend="gevent") as rt:
        rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
        parent = rt.spawn("echo")
        run = rt.subagents.start(
            "local",
            SubagentStartRequest(
                parent=parent, prompt="x", signal=AbortSignal.never(), model="slow"
            ),
        )
        assert gate.wait_reached(30)
        first = gevent.spawn(run.dispose, 30)
        second = gevent.spawn(run.dispose, 30)
        listed = rt.subagents.list_children(parent.session_id)
        first.get(timeout=60)
        second.get(timeout=60)
        assert run.result.get(0).stop_reason == "cancelled"
        assert rt.agents.get(run.id) is None
        assert [row.id for row in listed.rows] in ([], [run.id])
    assert watch.switches > 0
    assert watch.held == []


def test_children_started_followed_up_listed_and_drained_hold_no_lock_across_a_yield(
    db: str,
) -> None:
    """R-ONE-11, R-FUP-1, R-LIST-8, R-DRAIN-1 on gevent: the runtime's ordinary work
    on a blocking store -- a one-shot run and its dispose, a continuable child's
    start and follow-ups, listings while it settles, a drain, the close -- holds
    no plain lock across any switch of the thread."""
    with HeldLockWatch() as watch, Runtime(db, backend="gevent") as rt:
        parent = rt.spawn("echo")
        run = rt.subagents.start(
            "local",
            SubagentStartRequest(parent=parent, prompt="x", signal=AbortSignal.never()),
        )
        assert run.result.get(30).stop_reason == "completed"
        run.dispose(30)
        child = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=parent, provider="local", prompt="y", label="c")
        ).child_id

        def follow_up(i: int) -> Any:
            return rt.subagents.followup(parent, child, f"f{i}")

        senders = [gevent.spawn(follow_up, i) for i in range(3)]
        listings = [
            gevent.spawn(rt.subagents.list_descendants, parent.session_id) for _ in range(2)
        ]
        rows = rt.subagents.list_children(parent.session_id).rows
        gevent.joinall([*senders, *listings], timeout=60, raise_error=True)
        assert {row.id for row in rows} <= {run.id, child}
        rt.sessions.flush()
        rt.subagents.drain_continuable_descendants([parent])
        assert {row.id for row in rt.subagents.list_children(parent.session_id).rows} == {
            run.id,
            child,
        }
    assert watch.switches > 0
    assert watch.held == []


def test_a_failed_inline_writes_abort_listener_may_wait_on_another_greenlet() -> None:
    """R-INT-7, R-INT-8 on gevent: the in-memory store is written inline, under the
    session's lock; a write of it that fails stops the agent, which aborts the
    running turn's signal. Its listener waits for another greenlet that reads the
    same session first: the stop ran with the session's lock held, so that read
    stopped the whole thread (the listener never ran again). Now no lock is held
    across the listener's wait, the interrupt returns, the agent stops."""
    store = MemoryStore()
    read: list[int] = []
    with HeldLockWatch() as watch, Runtime(store, backend="gevent") as rt:

        def listener_for(turn: Any, _parent: Any) -> Any:
            sid = turn.agent.session_id

            def listener(_reason: Any) -> None:
                done = gevent.event.Event()

                def reader() -> None:
                    try:  # the live tail (its lock), then the store, which lost it
                        read.append(len(rt.sessions.read(sid)))
                    except SubagentError as exc:
                        read.append(exc.code)
                    finally:
                        done.set()

                gevent.spawn(reader)
                assert done.wait(30)

            return listener

        # Its session deleted, as another holder of the store would: writes fail.
        parent, child, agent = listening_child(rt, store, listener_for)
        rt.subagents.interrupt(child, UserAuthority(parent.session_id))
        assert agent.wait_disposed(30)
        assert read == [ErrorCode.SESSION_NOT_FOUND]
        (failure,) = rt.sessions.statistics().persistence_failures
        assert failure.session_id == child
    assert watch.switches > 0
    assert watch.held == []
