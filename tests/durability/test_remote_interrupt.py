"""An interrupt reaches a child live in another process sharing the store.

``subagents.interrupt(child_id, UserAuthority(parent_id))`` in a runtime where
the child is not live used to be a no-op (an absent target), although the child
ran in another process on the same store -- a server worker that did not hold a
tree could not interrupt it. Now the interrupt is asked of the child's lease
holder through its doorbell (or ``NOTIFY`` on PostgreSQL); the holder decides
as an interrupt asked there would, for the turn that was running when it was
asked. Runtimes on one store in one process stand in for processes (their
leases and doorbells are their own); ``db`` runs each test on SQLite and on
PostgreSQL, ``backend`` on both runtimes.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest
from durability_kit import gated, worker
from subagents.actors import ContinuableStartSpec, Runtime, UserAuthority
from subagents.actors._kernel import ring
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Block, Gate, ScriptedBehaviour
from subagents.protocol import (
    ErrorCode,
    InterruptEvent,
    SessionId,
    SubagentError,
    TurnEnd,
    new_session_id,
)


class SetBackClock:
    """The system's UTC clock, minus ``back`` (a test sets it back)."""

    def __init__(self) -> None:
        self.back = dt.timedelta(0)

    def __call__(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) - self.back


@pytest.fixture
def b_clock() -> SetBackClock:
    return SetBackClock()


@pytest.fixture
def pair(backend: Backend, db: str, b_clock: SetBackClock) -> Iterator[list[Runtime]]:
    """Two strict runtimes on one store: ``a`` runs the tree, ``b`` (on ``b_clock``)
    asks."""
    made: list[Runtime] = []
    try:
        made.append(Runtime(db, backend=backend))
        made.append(Runtime(db, backend=backend, clock=b_clock))
        yield made
    finally:
        for rt in reversed(made):
            rt.close()


def _blocked_child(
    rt: Runtime, gate: Gate, root: Any = None, model: str = "blocker"
) -> tuple[Any, SessionId]:
    """A root (made unless given) and a continuable child of it whose every turn
    waits at ``gate`` -- its first turn has reached the gate when this returns."""
    rt.models.register(model, lambda _o: ScriptedBehaviour([Block(gate)]), replace=True)
    if root is None:
        root = rt.spawn("echo", label="root")
    child_id, _mid = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="p", label="c", model=model)
    )
    assert gate.wait_reached(10)
    return root, child_id


def _log(rt: Runtime, sid: SessionId) -> list[Any]:
    assert rt.store is not None
    rt.sessions.flush()
    return [r.event for r in rt.store.read(sid)]


def test_an_interrupt_reaches_a_child_live_in_another_process(pair: list[Runtime]) -> None:
    """The turn running in ``a`` is cut (it ends ``cancelled``, the interrupt logged
    inside it with the user's authority and the parent's address); ``b`` never
    activates the child, which takes its next follow-up as usual."""
    a, b = pair
    gate = Gate()
    root, child_id = _blocked_child(a, gate)
    child = a.agents.get(child_id)
    assert child is not None
    b.subagents.interrupt(child_id, UserAuthority(root.session_id))
    assert child.wait_idle(10)
    assert b.agents.get(child_id) is None
    events = _log(a, child_id)
    (interrupt,) = [e for e in events if isinstance(e, InterruptEvent)]
    assert (interrupt.authority, interrupt.by_session) == ("user", root.session_id)
    assert [e.stop_reason for e in events if isinstance(e, TurnEnd)] == ["cancelled"]
    gate.release()
    a.subagents.followup(root, child_id, "again")  # its inbox kept: the next turn runs
    again = a.agents.get(child_id)  # None: its turn ran, it settled already
    assert again is None or again.wait_idle(10)
    assert [e.stop_reason for e in _log(a, child_id) if isinstance(e, TurnEnd)] == [
        "cancelled",
        "completed",
    ]


def test_an_interrupt_asked_on_a_late_reading_of_the_servers_clock_cuts_its_turn(
    pair: list[Runtime], db: str
) -> None:
    """R-INT-8: the asker's reading of PostgreSQL's clock came back late (its thread
    took the answer a second after the server gave it, as on a loaded host), so its
    extrapolation runs behind the server's; the interrupt it asks of a turn that
    began just before still cuts that turn -- the ask is stamped the latest it may
    be, by the reading's round trip -- instead of being dropped as meant for an
    earlier one."""
    if not db.startswith("postgresql"):
        pytest.skip("one host's clock is every SQLite process's: nothing to read late")
    a, b = pair
    lease_clock: Any = b.sessions.leases._store_clock  # type: ignore[union-attr]
    read = lease_clock._read

    def late_read() -> float:
        value = read()
        time.sleep(2.0)  # the answer taken late (latency injected, not an ordering)
        return float(value)

    lease_clock._read = late_read
    lease_clock._tried = -float("inf")
    b.sessions.leases.now()  # reads again: two seconds' round trip, one behind
    gate = Gate()
    root, child_id = _blocked_child(a, gate)
    child = a.agents.get(child_id)
    assert child is not None
    b.subagents.interrupt(child_id, UserAuthority(root.session_id))
    assert child.wait_idle(10)
    assert [e.stop_reason for e in _log(a, child_id) if isinstance(e, TurnEnd)] == ["cancelled"]
    gate.release()


def test_a_late_interrupt_leaves_a_turn_that_began_after_it_alone(
    pair: list[Runtime], b_clock: SetBackClock
) -> None:
    """Asked (by the store's clock, as ``b`` reads it: leases') an hour before the
    running turn began, the interrupt means a turn that has ended: the holder cuts
    nothing and logs nothing. A second interrupt, asked now of another child,
    shows when the first was handled (the holder's mail task takes rings in
    order). ``b``'s own clock (an hour back as well) is not what is read."""
    a, b = pair
    late_gate, marker_gate = Gate(), Gate()
    root, late = _blocked_child(a, late_gate)
    _, marker = _blocked_child(a, marker_gate, root, "marker")
    marker_agent, late_agent = a.agents.get(marker), a.agents.get(late)
    assert marker_agent is not None and late_agent is not None
    leases: Any = b.sessions.leases
    store_clock = leases._clock
    b_clock.back = dt.timedelta(hours=1)
    leases._clock = lambda: store_clock() - 3600.0
    b.subagents.interrupt(late, UserAuthority(root.session_id))
    leases._clock = store_clock
    b_clock.back = dt.timedelta(0)
    b.subagents.interrupt(marker, UserAuthority(root.session_id))
    assert marker_agent.wait_idle(10)  # cut: the late ring was handled before
    assert late_agent.running_turn == 0
    late_gate.release()
    assert late_agent.wait_idle(10)
    events = _log(a, late)
    assert not [e for e in events if isinstance(e, InterruptEvent)]
    assert [e.stop_reason for e in events if isinstance(e, TurnEnd)] == ["completed"]
    assert [e.stop_reason for e in _log(a, marker) if isinstance(e, TurnEnd)] == ["cancelled"]


def test_a_remote_interrupt_by_another_parent_is_refused(pair: list[Runtime]) -> None:
    """``UNAUTHORIZED`` in the asking process, as for a child live there, and nothing
    reaches the child; an unknown or unheld session is an accepted no-op."""
    a, b = pair
    gate = Gate()
    root, child_id = _blocked_child(a, gate)
    stranger = a.spawn("echo", label="stranger")
    with pytest.raises(SubagentError) as err:
        b.subagents.interrupt(child_id, UserAuthority(stranger.session_id))
    assert err.value.code == ErrorCode.UNAUTHORIZED
    with pytest.raises(SubagentError) as err:
        b.subagents.interrupt(child_id, UserAuthority("not an id"))
    assert err.value.code == ErrorCode.UNAUTHORIZED
    b.subagents.interrupt(new_session_id(), UserAuthority(root.session_id))  # absent
    b.subagents.interrupt(root.session_id, UserAuthority(root.session_id))  # not a child
    child = a.agents.get(child_id)
    assert child is not None and child.running_turn == 0
    gate.release()
    assert child.wait_idle(10)
    events = _log(a, child_id)
    assert not [e for e in events if isinstance(e, InterruptEvent)]
    assert [e.stop_reason for e in events if isinstance(e, TurnEnd)] == ["completed"]


def test_an_interrupt_reaches_a_child_in_another_real_process(backend: Backend, db: str) -> None:
    """The same across a real process boundary: a worker holds the tree, this
    process (which never held it) interrupts its child's running turn."""
    with worker("interrupt_worker.py", db, backend.name) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        root, child = proc.stdout.readline().split()
        with Runtime(db, backend=backend) as rt:
            rt.subagents.interrupt(child, UserAuthority(root))
            assert rt.agents.get(child) is None
        assert proc.stdout.readline().split() == ["cancelled", root]
        proc.stdin.close()
        assert proc.wait(30) == 0


def test_a_remote_interrupt_never_cuts_the_turn_after_the_one_it_meant(
    pair: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-INT-8: the holder decides for the turn running when the interrupt was
    asked. Forced interleaving, 5 rounds: that turn ends and the next one begins
    while the interrupt's event is being logged (between the check and the
    cancel) -- the cancel cut the next turn. Now it cuts only the turn it checked."""
    a, _ = pair
    gates: dict[str, Gate] = {}
    a.models.register("gated", lambda _o: gated(gates))
    root = a.spawn("echo", label="root")
    child, _ = a.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="p", label="c", model="gated")
    )
    sessions = a.sessions
    logging = sessions.append
    meant: list[str] = []

    def append(live: Any, events: Any, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(e, InterruptEvent) for e in events):
            first, then = meant
            gates[first].release()  # the turn it meant ends ...
            assert gates[then].wait_reached(10)  # ... and the next one begins
        return logging(live, events, *args, **kwargs)

    monkeypatch.setattr(sessions, "append", append)
    for i in range(5):
        meant[:] = [f"one{i}", f"two{i}"]
        for content in meant:
            gates[content] = Gate(content)
            a.subagents.followup(root, child, content)
        assert gates[meant[0]].wait_reached(10)
        now = a.sessions.leases.now()  # the store's clock, which rings carry
        a.continuation.interrupt_asked(child, root.session_id, now)
        gates[meant[1]].release()
        agent = a.agents.get(child)
        assert agent is not None and agent.wait_idle(10)
    ends = [e.stop_reason for e in _log(a, child) if isinstance(e, TurnEnd)]
    assert ends == ["completed"] * 11


def test_a_ring_of_an_unknown_kind_is_refused(pair: list[Runtime]) -> None:
    """What the mail hands over is checked: a kind that is none of the three is
    ``INVALID_ARGUMENT`` (it was taken for a user's interrupt)."""
    a, _ = pair
    with pytest.raises(SubagentError) as err:
        a.continuation.interrupt_asked(new_session_id(), new_session_id(), 0.0, "bogus")
    assert err.value.code == ErrorCode.INVALID_ARGUMENT


def test_an_interrupt_waits_for_room_at_a_busy_holders_doorbell(
    pair: list[Runtime], db: str, backend: Backend
) -> None:
    """R-INT-1: the holder's doorbell holds ten rings (Linux's queue of datagrams);
    its mail task is busy (held here) while they fill it. An interrupt asked then
    rings again until there is room, so the turn is cut once the mail task reads
    again. Its one ring failed and the interrupt was lost: no sweep finds an
    interrupt again (a lost ring of mail waits for the next sweep only). The hold
    lasts 0.3 s of the interrupt's 2 s of patience: a holder busy that long."""
    if db.startswith("postgresql"):
        pytest.skip("NOTIFY through the server: no doorbell of the holder's to fill")
    a, b = pair
    gate = Gate()
    root, child_id = _blocked_child(a, gate)
    child = a.agents.get(child_id)
    assert a.mail is not None and child is not None
    bell = a.mail.doorbell
    real = bell.wait
    busy, free = backend.event(), backend.event()

    def held_wait(timeout: float | None) -> list[bytes] | None:
        busy.set()
        free.wait(30)
        return real(timeout)

    bell.wait = held_wait  # type: ignore[method-assign]
    assert ring(bell.local_address, b"w" * 16)  # the wait under way returns
    assert busy.wait(10)  # the next one holds the mail task
    while ring(bell.local_address, b"x" * 16):
        pass  # until the queue is full
    backend.spawn(lambda: (backend.sleep(0.3), free.set()), name="free-the-mail-task")
    b.subagents.interrupt(child_id, UserAuthority(root.session_id))
    assert child.wait_idle(10)
    assert [e.stop_reason for e in _log(a, child_id) if isinstance(e, TurnEnd)] == ["cancelled"]
    gate.release()
