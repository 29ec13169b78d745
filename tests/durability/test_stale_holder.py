"""A holder that lost its session (its lease expired while it stalled, another
process took the session over and ran on) acts on nothing it accepted:

* the checkpoint its disposal folds is fenced by its lease, as its appends are:
  it used to be stored -- state through seqs whose later events were the new
  holder's, where the next resume started -- and is refused (``LEASE_LOST``);
* its running turn takes no steered message: the new holder runs it (it used
  to be handed to the stale turn as well, after the new holder had run it).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from durability_kit import until
from subagents.actors import Runtime, Steered, Turn
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import ErrorCode, MessageEvent, SubagentError
from subagents.store import open_store

pytestmark = pytest.mark.timeout(60)


def test_a_holder_that_lost_the_session_stores_no_checkpoint(backend: Backend, db: str) -> None:
    """R-DUR-3 (fencing): the agent's disposal after another holder took its session
    over leaves the store's checkpoint as it was; a disposal that kept its lease
    stores one (the same runtime, another session)."""
    with Runtime(db, backend=backend) as rt:
        lost, kept = rt.spawn("echo", label="lost"), rt.spawn("echo", label="kept")
        for agent in (lost, kept):
            agent.followup("hi")
            assert agent.wait_idle(10)
        with open_store(db) as other:
            # The lease taken as if it had expired (an hour on): the holder is stale.
            later = time.time() + 3600
            taken = other.acquire_lease(lost.session_id, "thief", now=later, expires=later + 60)
            assert taken.epoch == 2
            lost.dispose()
            kept.dispose()
            assert other.get_checkpoint(lost.session_id) is None
            assert other.get_checkpoint(kept.session_id) is not None
            # A refused checkpoint is no failure of the session's writes: one that
            # stopped them stopped a new activation of it here (the lease back).
            stats = rt.sessions.statistics()
            assert (stats.failed_writes, stats.persistence_failures) == (0, ()), stats
            writer: Any = rt.sessions._writer
            assert writer.take_failure(lost.session_id) is None
            lease = other.get_lease(lost.session_id)
            assert lease is not None and lease.holder == "thief"


def test_a_turn_whose_holder_lost_the_session_takes_no_steered_message(
    backend: Backend, db: str
) -> None:
    """S-1 (steering) under fencing: a message steered into a running turn; then
    another holder takes the session over (as after a stall past the lease) and
    this runtime learns it from its renewal. The stale turn's next safe point
    hands it nothing: the message is the new holder's to run, once."""
    gate = Gate("safe point")
    seen: list[Any] = []

    def stall(turn: Turn) -> Any:
        if turn.content == "first":
            gate.pass_through()
            seen.append([m.content for m in turn.steering()])
        return "ran"

    with Runtime(db, backend=backend, lease_ttl=0.6) as rt:
        rt.models.register("stall", lambda _o: stall)
        agent = rt.spawn("stall")
        sid = agent.session_id
        agent.followup("first")
        assert gate.wait_reached(10)
        steered = agent.followup("steer-me", steer=True)
        assert isinstance(steered, Steered) and steered.outcome == "steered"
        leases: Any = rt.sessions.leases
        with open_store(db) as other:
            later = time.time() + 3600
            other.acquire_lease(sid, "thief", now=later, expires=later + 60)
            assert until(rt, lambda: not leases.holds(sid), timeout=20)  # its renewal saw it
            gate.release()
            assert agent.wait_disposed(20) or agent.wait_idle(20)
            assert seen == [[]]
            logged = [r.event.content for r in other.read(sid) if isinstance(r.event, MessageEvent)]
            assert "steer-me" not in logged  # not recorded inside the stale turn
            waiting = [getattr(e.event, "content", None) for e in other.pending(sid)]
            assert waiting == ["first", "steer-me"]  # the new holder's to run, in order


def test_a_session_taken_over_before_any_renewal_is_let_go(backend: Backend, db: str) -> None:
    """R-DUR-3: a session whose lease another holder took before this runtime's
    first renewal saw it used to count as "created under a lease no renewal has
    seen yet" for ever -- never let go, its turns started and then fenced. The
    renewal asks the store for such a lease when it was not renewed."""
    with Runtime(db, backend=backend, lease_ttl=3.0) as rt:  # the first renewal after 1 s
        agent = rt.spawn("echo")
        sid = agent.session_id
        leases: Any = rt.sessions.leases
        with open_store(db) as other:
            later = time.time() + 3600
            other.acquire_lease(sid, "thief", now=later, expires=later + 60)
        assert until(rt, lambda: not leases.holds(sid), timeout=20)
        assert agent.wait_disposed(20)  # let go, as any session taken over


def test_flush_of_a_session_whose_writes_a_lost_lease_refused_says_so(
    backend: Backend, db: str
) -> None:
    """R-DUR-3 (fencing): a stale holder's writes refused for its lost lease end its
    activation (the agent stops); ``flush(session_id)`` afterwards raises
    ``LEASE_LOST`` -- its writes did not reach the store -- though the writer no
    longer keeps the session's failure once its activation ended, and a lost
    lease is no persistence failure of the statistics."""
    with Runtime(db, backend=backend, durability="relaxed") as rt:
        agent = rt.spawn("echo", label="stale")
        agent.followup("hi")
        assert agent.wait_idle(10)
        rt.sessions.flush(agent.session_id)
        with open_store(db) as other:
            later = time.time() + 3600  # the lease taken as if it had expired
            other.acquire_lease(agent.session_id, "thief", now=later, expires=later + 60)
            agent.followup("lost")  # (relaxed: queued; its turn's writes are refused)
            assert until(rt, lambda: rt.agents.get(agent.session_id) is None, 20)
            with pytest.raises(SubagentError) as err:
                rt.sessions.flush(agent.session_id)
            assert err.value.code == ErrorCode.LEASE_LOST
            assert rt.sessions.statistics().persistence_failures == ()


def test_a_send_to_a_session_taken_over_meanwhile_is_delivered_to_its_inbox(
    backend: Backend, db: str
) -> None:
    """R-DUR-3, L-7: a ``send`` to a session live here whose lease another holder
    took over before this runtime noticed raised the agent's refused commit,
    ``LEASE_LOST`` -- an error ``send`` does not name, for a session that is now
    simply held elsewhere (the crash soak met it behind a stalled process). It is
    sent as to a session another process holds instead: committed to its inbox
    for the holder, and the id returned."""
    with Runtime(db, backend=backend) as rt:
        agent = rt.spawn("echo", label="taken")
        sid = agent.session_id
        with open_store(db) as other:
            later = time.time() + 3600  # the lease taken as if it had expired
            other.acquire_lease(sid, "thief", now=later, expires=later + 60)
            mid = rt.agents.send(sid, "after")
            assert [e.message_id for e in other.pending(sid)] == [mid]


def test_a_late_renewal_whose_count_hides_a_loss_confirms_nothing(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-DUR-3, L-7: a renewal that comes late (a stall: the process stopped, its
    renewal task starved) renewed by count, and a count that matched -- a lease
    lost while it stood still, hidden by another lease row of this holder's --
    confirmed every lease held: the turn queued behind the running one then
    started at once, from memory, though its session had been taken over (the
    crash soak saw a stopped holder run a message the new holder had run, not
    flagged redelivered). A late renewal reads the list of what it renewed."""
    with Runtime(db, backend=backend) as made:
        spare = made.spawn("echo", label="spare").session_id  # released at close
    gates = {"m0": Gate("m0")}
    ran: list[Any] = []

    def on_turn(turn: Turn) -> Any:
        ran.append(turn.content)
        gate = gates.get(turn.content)
        if gate is not None:
            gate.pass_through(turn.signal)
        return turn.content

    with Runtime(db, backend=backend, lease_ttl=1.5) as rt:
        rt.models.register("g", lambda _o: on_turn)
        agent = rt.spawn("g", label="taken")
        sid = agent.session_id
        leases: Any = rt.sessions.leases
        store: Any = rt.store
        late = Gate("renewal")
        count = store.renew_lease_count
        first = [True]

        def held_back(holder: str, expires: float) -> int:
            if not first[0]:
                return int(count(holder, expires))
            late.pass_through()
            try:
                return int(count(holder, expires))
            finally:
                first[0] = False  # this late renewal has counted

        monkeypatch.setattr(store, "renew_lease_count", held_back)
        agent.followup("m0")
        agent.followup("m1")  # queued behind m0, in memory
        assert gates["m0"].wait_reached(10)
        assert until(rt, lambda: time.monotonic() > leases._sure_until, timeout=10)
        with open_store(db) as other:
            later = time.time() + 3600  # taken over while this runtime stood still
            other.acquire_lease(sid, "thief", now=later, expires=later + 60)
            now = time.time()  # and a lease row of this holder's it does not know of
            other.acquire_lease(spare, leases.holder.id, now=now, expires=now + 3600)
        late.release()
        settled = lambda: leases._sure_until > time.monotonic() or not leases.holds(sid)  # noqa: E731
        assert until(rt, lambda: not first[0] and settled(), timeout=10)  # the renewal's verdict
        gates["m0"].release()
        assert agent.wait_disposed(20)
        assert ran == ["m0"]
