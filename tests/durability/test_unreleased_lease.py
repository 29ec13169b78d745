"""A lease release the store refused is retried: the session is not left leased to
a process that runs nothing of it (L-7), on both stores and both backends.

An activation gives its lease up with its last write, through the session writer
(write-behind). When that batch failed -- here the store refuses the release
itself: a trigger installed from outside, a real SQLite or PostgreSQL error; in
production a server restart or a connection lost at the commit, a database
locked past the busy timeout -- the release was dropped with it. The lease
stayed this runtime's, and its heartbeat (it holds other sessions) kept it live
for as long as it lived: every other process was refused ``LEASE_HELD``. Now the
release is retried every renewal period until the store takes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from durability_kit import Noted, resumed_elsewhere, until
from refusal_kit import allow, refuse
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId

pytestmark = pytest.mark.timeout(120)

TTL = 2.0


def _refuse_release(db: str, session: SessionId) -> None:
    """Make the store refuse to release ``session``'s lease (a real store error)."""
    refuse(db, session, table="leases", op="UPDATE", also=" AND NEW.holder IS NULL", what="release")


def _heal(db: str) -> None:
    allow(db, table="leases")


def _failed(rt: Runtime, sid: SessionId) -> bool:
    return any(f.session_id == sid for f in rt.sessions.statistics().persistence_failures)


def test_a_refused_release_is_retried_until_the_store_takes_it(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """L-7: an agent is disposed while the store refuses its lease's release; the
    runtime keeps another agent live (its heartbeat goes on). Once the store takes
    releases again, the lease is released within a few renewal periods, another
    process (a real one) resumes the session, and this runtime resumes it after."""
    noted = Noted()
    with Runtime(db, backend=backend, lease_ttl=TTL) as rt:
        noted.register(rt, "rt", model="mark")
        live = rt.spawn("mark")  # held all along: the heartbeat goes on
        live.followup("live")
        gone = rt.spawn("mark")
        gone.followup("first")
        assert live.wait_idle(10) and gone.wait_idle(10)
        rt.sessions.flush()
        sid = gone.session_id
        assert rt.store is not None and rt.sessions.leases is not None
        holder = rt.sessions.leases.holder.id
        _refuse_release(db, sid)
        try:
            gone.dispose()
            assert gone.wait_disposed(10)
            # The release was tried (and refused): the lease is still this runtime's.
            assert until(rt, lambda: _failed(rt, sid), 10)
            lease = rt.store.get_lease(sid)
            assert lease is not None and lease.holder == holder
        finally:
            _heal(db)
        # Ten lease ttls: its own expiry is long past; only the heartbeat holds it.
        assert until(rt, lambda: rt.store.get_lease(sid).holder is None, 10 * TTL)  # type: ignore[union-attr]
        resumed_elsewhere(rt, db, sid, tmp_path / "marks", backend.name, str(TTL))
        again = rt.agents.resume(sid)
        again.followup("again")
        assert noted.runs("again", ["rt"], 20)
