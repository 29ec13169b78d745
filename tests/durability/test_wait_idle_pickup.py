"""``Runtime.wait_idle`` waits for what only the mail pickup hands to a live agent.

A ``send`` to a session whose activation is in progress (registered, its replay
not queued yet) commits its message taken by nobody and rings this runtime's own
pickup, which takes it into the agent's loop later (``_agents/_ahead.py``). The
send has returned, so a script's ``wait_idle`` next must cover that message: it
returned at once (every agent idle: nothing was queued yet), and the message
ran after it -- a load-dependent failure of the racing-sends test, whose last
round's message had not run when it counted. Forced here: the activation is held
before its replay, the second send returns, the pickup is held.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._agents import _registry
from subagents.actors._agents._mail import Mailman
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import SessionId


@pytest.fixture
def rt(backend: Backend, db: str) -> Iterator[Runtime]:
    with Runtime(db, backend=backend, durability="strict") as runtime:
        yield runtime


def _held_activation(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> tuple[SessionId, Gate, list[Any]]:
    """``(session, gate, ran)``: a cold top-level session whose next activation is held
    at ``gate`` before its replay; ``ran`` gets the messages its turns run."""
    ran: list[Any] = []
    rt.models.register("note", lambda _o: lambda turn: ran.extend(turn.messages) or "ok")
    sid = rt.spawn("note", label="root").session_id
    agent = rt.agents.get(sid)
    assert agent is not None
    agent.dispose()
    replayed, replay_first = Gate("replay"), _registry.replay_first

    def held_replay(agent: Any, pending: Any, **kw: Any) -> None:
        if agent.session_id == sid and not replayed.released:
            replayed.pass_through()
        replay_first(agent, pending, **kw)

    monkeypatch.setattr(_registry, "replay_first", held_replay)
    return sid, replayed, ran


def _send_two(rt: Runtime, sid: SessionId, replayed: Gate) -> tuple[Any, dict[str, Any], Any]:
    """``(task, got, second)``: a task sends "first", which activates ``sid`` (held at
    ``replayed``; its id in ``got`` once sent); "second" is sent meanwhile --
    committed untaken, the pickup rung."""
    got: dict[str, Any] = {}
    first = rt.backend.spawn(lambda: got.update(first=rt.agents.send(sid, "first")))
    assert replayed.wait_reached(30)  # live, its replay not queued
    return first, got, rt.agents.send(sid, "second")


def test_wait_idle_covers_a_message_the_pickup_still_owes(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-FUP-6, R-DUR-3: the held pickup keeps ``wait_idle`` waiting (it returned
    True at once); released, the message has run by the time ``wait_idle`` returns."""
    sid, replayed, ran = _held_activation(rt, monkeypatch)
    picking, pickup = Gate("pickup"), Mailman.pickup

    def held_pickup(self: Mailman, session_id: Any) -> None:
        if session_id == sid and not picking.released:
            picking.pass_through()
        pickup(self, session_id)

    monkeypatch.setattr(Mailman, "pickup", held_pickup)
    first, got, second = _send_two(rt, sid, replayed)
    assert picking.wait_reached(30)
    replayed.release()
    assert first.join(30)
    assert not rt.wait_idle(0.3)  # the pickup owes the second message (it returned True)
    picking.release()
    assert rt.wait_idle(30)
    assert [m.message_id for m in ran] == [got["first"], second]


def test_a_ring_owed_as_the_runtime_closes_is_not_waited_for(rt: Runtime) -> None:
    """A ring made as the runtime closes (a release that found messages waiting)
    has no pickup to answer it any more: ``wait_idle`` after ``close`` returns at
    once, True (it waited for its whole timeout, False)."""
    sid = rt.spawn("echo", label="root").session_id
    rt.sessions.rung.ring(sid)  # owed: the mail task stops before it looks
    rt.close()
    assert rt.wait_idle(30)
    assert not rt.sessions.rung


def test_a_pickup_that_failed_leaves_its_ring_owed_until_the_next_sweep(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-FUP-6, R-DUR-3: the pickup fails once (here its look-up of the live agent;
    an outage of the store's, say, for an orphan): the message it owed waits for
    the next sweep (or a later ring's pickup), and ``wait_idle`` waits with it (the
    failed pickup answered the ring: ``wait_idle`` returned before it ran)."""
    with Runtime(db, backend=backend, durability="strict", lease_ttl=3.0) as rt:
        sid, replayed, ran = _held_activation(rt, monkeypatch)
        failed = rt.backend.event()
        assert rt.mail is not None
        live = rt.mail._live

        def failing_once(session_id: Any) -> Any:
            if session_id == sid and not failed.is_set():
                failed.set()
                raise RuntimeError("the pickup failed")
            return live(session_id)

        monkeypatch.setattr(rt.mail, "_live", failing_once)
        first, got, second = _send_two(rt, sid, replayed)
        assert failed.wait(30)
        replayed.release()
        assert first.join(30)
        # Idle only once the message ran: a later pickup (the activation rings one
        # as its replay is queued) or a sweep delivers it; the failed one did not.
        assert not rt.wait_idle(0.3) or [m.message_id for m in ran] == [got["first"], second]
        assert rt.wait_idle(30)
        assert [m.message_id for m in ran] == [got["first"], second]
