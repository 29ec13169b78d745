"""A drain reaches the continuable descendants another process holds (R-DRAIN-1,
R-DRAIN-5). A top-level parent disposed in one process leaves its continuable
children running there (they work while their parent is offline); resumed in
another process and drained there, the drain only saw what that process held:
it returned while the child ran its queued turns, below a drained parent. Now
the drain asks the holder (a drain ring), which cuts the child's turn, drops what
waits and releases it; the drain returns once no other process holds it.
Runtimes on one store in one process stand in for processes (their leases and
doorbells are their own); ``db`` runs it on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest
from durability_kit import Noted, gated
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import ErrorCode, SessionId, SubagentError, TurnEnd


def test_a_drain_releases_a_child_another_process_runs(backend: Backend, db: str) -> None:
    gates: dict[str, Gate] = {}
    with Runtime(db, backend=backend) as a, Runtime(db, backend=backend) as b:
        for rt in (a, b):
            rt.models.register("gated", lambda _o: gated(gates))
        for round_ in range(3):
            parent = a.spawn("echo", label=f"p{round_}")
            child, _ = a.subagents.start_continuable(
                ContinuableStartSpec(
                    parent=parent, provider="local", prompt="p0", label="c", model="gated"
                )
            )
            busy = gates[f"busy{round_}"] = Gate("busy")
            for content in (f"busy{round_}", "q1", "q2"):
                a.subagents.followup(parent, child, content)
            assert busy.wait_reached(10)
            parent.dispose()  # the child keeps running here, its parent offline
            assert parent.wait_disposed(10)
            a.sessions.flush()  # its lease released in the store
            held = a.agents.get(child)
            assert held is not None
            resumed = b.agents.resume(parent.session_id)
            b.subagents.drain_continuable_descendants(resumed, timeout=20)
            assert held.wait_disposed(10)  # released there by the time the drain returned
            assert a.agents.get(child) is None and b.agents.get(child) is None
            assert b.store is not None
            lease = b.store.get_lease(child)
            assert lease is not None and lease.holder is None
            ends = [r.event for r in b.store.read(child) if isinstance(r.event, TurnEnd)]
            assert [e.stop_reason for e in ends] == ["completed", *["cancelled"] * 3]
            resumed.dispose()


def _held_elsewhere(a: Runtime, gates: dict[str, Gate]) -> tuple[Any, SessionId]:
    """A parent disposed in ``a`` whose continuable child keeps running there, its
    turn waiting at a gate; returns the parent's agent and the child's id."""
    parent = a.spawn("echo", label="p")
    child, _ = a.subagents.start_continuable(
        ContinuableStartSpec(parent=parent, provider="local", prompt="p0", label="c", model="gated")
    )
    busy = gates["busy"] = Gate("busy")
    for content in ("busy", "q1"):
        a.subagents.followup(parent, child, content)
    assert busy.wait_reached(10)
    parent.dispose()
    assert parent.wait_disposed(10)
    a.sessions.flush()
    return parent, child


def test_a_lost_drain_ring_is_sent_again(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ring is a hint: the first drain ring lost, the drain rings again and the
    child is released (it waited for ever, or until its timeout)."""
    gates: dict[str, Gate] = {}
    with Runtime(db, backend=backend) as a, Runtime(db, backend=backend) as b:
        for rt in (a, b):
            rt.models.register("gated", lambda _o: gated(gates))
        parent, child = _held_elsewhere(a, gates)
        sent = b.sessions.ring
        lost: list[bytes] = []

        def lossy(address: Any, payload: bytes) -> bool:
            if len(payload) != 16 and not lost:
                lost.append(payload)
                return False  # the first drain ring never arrives
            return sent(address, payload)

        monkeypatch.setattr(b.sessions, "ring", lossy)
        resumed = b.agents.resume(parent.session_id)
        b.subagents.drain_continuable_descendants(resumed, timeout=20)
        assert lost and a.agents.get(child) is None


def test_a_store_that_cannot_say_is_no_release(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the drain waits, a lease read that fails says nothing: the child still
    counts as held (the drain returned as though it had been released). Here its
    holder never answers the ring: the drain times out."""
    gates: dict[str, Gate] = {}
    with Runtime(db, backend=backend) as a, Runtime(db, backend=backend) as b:
        for rt in (a, b):
            rt.models.register("gated", lambda _o: gated(gates))
        parent, child = _held_elsewhere(a, gates)
        monkeypatch.setattr(a.mail, "_interrupt", lambda *args: None)  # deaf to rings
        assert b.store is not None
        reads = b.store.get_leases
        calls: list[int] = []

        def flaky(ids: Any) -> Any:
            calls.append(1)
            if len(calls) == 2:  # the first read of the wait
                raise SubagentError("down for a moment", code=ErrorCode.PERSISTENCE_UNAVAILABLE)
            return reads(ids)

        monkeypatch.setattr(b.store, "get_leases", flaky)
        resumed = b.agents.resume(parent.session_id)
        with pytest.raises(SubagentError) as err:
            b.subagents.drain_continuable_descendants(resumed, timeout=1.5)
        assert err.value.code == ErrorCode.TIMEOUT and len(calls) > 2
        assert a.agents.get(child) is not None  # never asked to let go: still there
        gates["busy"].release()


def test_a_drain_reaches_a_grandchild_another_process_runs(backend: Backend, db: str) -> None:
    """The drain rings every continuable descendant held elsewhere, a grandchild
    too: both released there, the grandchild's running turn cancelled."""
    gates: dict[str, Gate] = {"grand": Gate("grand")}

    def spawner(turn: Any) -> Any:
        if turn.index == 0:
            return turn.subagents.start_continuable("local", "grand", label="g", model="gated")[0]
        return turn.content

    with (
        Runtime(db, backend=backend, keep_warm=60) as a,
        Runtime(db, backend=backend) as b,
    ):
        for rt in (a, b):
            rt.models.register("gated", lambda _o: gated(gates))
            rt.models.register("spawner", lambda _o: spawner)
        parent = a.spawn("echo", label="p")
        child, _ = a.subagents.start_continuable(
            ContinuableStartSpec(
                parent=parent, provider="local", prompt="go", label="c", model="spawner"
            )
        )
        assert gates["grand"].wait_reached(10)
        started = a.agents.get(child)
        assert started is not None and started.wait_idle(10)  # its turn ended
        grand = SessionId(a.sessions.turn_ends(child)[0].output)
        parent.dispose()
        assert parent.wait_disposed(10)
        a.sessions.flush()
        held = [a.agents.get(child)]
        assert held[0] is not None
        held.append(a.agents.get(grand))
        assert held[1] is not None
        resumed = b.agents.resume(parent.session_id)
        b.subagents.drain_continuable_descendants(resumed, timeout=20)
        for agent in held:
            assert agent is not None and agent.wait_disposed(10)
        assert b.store is not None
        for sid in (child, grand):
            lease = b.store.get_lease(sid)
            assert lease is not None and lease.holder is None
        assert [e.stop_reason for e in b.sessions.turn_ends(grand)] == ["cancelled"]


def test_a_drain_asked_while_a_grandchild_materializes_there(backend: Backend, db: str) -> None:
    """R-DRAIN-3, R-DRAIN-5, forced interleaving: the holder is cold-resuming a
    grandchild for a follow-up (held at its setup, its lease taken) when drains
    are asked of it, for the child and for the grandchild (what its mail task
    runs for another process's drain rings; called here directly, since that
    task may itself wait behind the materialization). The child's cutoff covers
    the materialization in flight: the grandchild comes up drained (its
    follow-up dropped, admission closed) and is released, then the child."""
    gates: dict[str, Gate] = {"busy": Gate("busy")}
    materializing = Gate("materializing")
    ran: list[Any] = []

    def kid(turn: Any) -> Any:
        if turn.index == 0:
            return turn.subagents.start_continuable("local", "hi", label="g", model="noter")[0]
        return gated(gates)(turn)

    def noter(turn: Any) -> Any:
        ran.append(turn.content)
        return turn.content

    with Runtime(db, backend=backend) as a:
        a.models.register("kid", lambda _o: kid)
        a.models.register("noter", lambda _o: noter)
        armed: list[bool] = []

        def contribution(scope: Any) -> None:
            if armed and scope.agent.label == "g":
                materializing.pass_through(None)

        a.subagents.register_continuable_setup(contribution)
        ended = Noted()
        subscription = a.subagents.subscribe(
            lambda e: ended.add(("end", e.child_id, False)) if e.type == "subagent/end" else None
        )
        parent = a.spawn("echo", label="p")
        child, _ = a.subagents.start_continuable(
            ContinuableStartSpec(
                parent=parent, provider="local", prompt="go", label="c", model="kid"
            )
        )
        assert a.wait_idle(10)
        grand = SessionId(a.sessions.turn_ends(child)[0].output)
        # Settled (its end announced once it left residency): cold from here on.
        assert ended.wait_for(lambda items: ("end", grand, False) in items)
        subscription.dispose()
        assert a.wait_idle(10)
        assert a.agents.get(grand) is None and ran == ["hi"]
        a.subagents.followup(parent, child, "busy")
        assert gates["busy"].wait_reached(10)  # the child stays resident, its turn running
        held = a.agents.get(child)
        assert held is not None
        armed.append(True)
        box: dict[str, Any] = {}

        def later() -> None:
            try:
                box["value"] = a.subagents.followup(held, grand, "later")
            except BaseException as exc:
                box["error"] = exc

        box["error"] = None
        task = a.backend.spawn(later, name="test-later")
        assert materializing.wait_reached(10)  # the grandchild's lease taken, not published
        asked: dict[str, Any] = {}

        def drains() -> None:
            try:
                at = a.sessions.leases.now()
                a.continuation.interrupt_asked(SessionId(child), parent.session_id, at, "drain")
                a.continuation.interrupt_asked(grand, SessionId(child), at, "drain")
            except BaseException as exc:
                asked["error"] = exc

        draining = a.backend.spawn(drains, name="test-drains")
        materializing.release()
        assert draining.join(20) and "error" not in asked, asked
        assert task.join(10)
        assert held.wait_disposed(20)  # released, after the grandchild
        assert ran == ["hi"], box  # the follow-up admitted before the drain was dropped
        assert a.agents.get(grand) is None and a.agents.get(child) is None
        assert a.store is not None
        a.sessions.flush()
        for sid in (child, grand):
            lease = a.store.get_lease(sid)
            assert lease is not None and lease.holder is None
        assert [e.stop_reason for e in a.sessions.turn_ends(child)][-1] == "cancelled"
