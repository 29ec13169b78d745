"""A checkpoint is fenced by its holder's lease, as its appends are.

A runtime that lost a session (its lease expired while it stalled, another
process took the session over and wrote on) used to store the checkpoint its
disposal folded: state through a seq whose events, past what it got to write,
were the new holder's. The next resume started from that state. Now the store
refuses it (``LEASE_LOST``) and keeps what it had.
"""

from __future__ import annotations

import time

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
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
            lease = other.get_lease(lost.session_id)
            assert lease is not None and lease.holder == "thief"
