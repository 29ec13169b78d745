"""A lease whose acquisition waited long for the store is not trusted from memory
(L-7): one activation of a session at a time, on both stores and both backends.

A resume reads the clock, then asks the store for the lease with that reading
plus the ttl as its expiry. When the store made it wait -- another process held
SQLite's write lock, or the session's row lock on PostgreSQL (a stalled holder in
the middle of a write) -- longer than the ttl, the lease it wrote had expired
already, and no heartbeat of the new holder kept it yet. The holder trusted it
from memory for two thirds of the ttl after the acquisition *returned*: a turn
started without asking the store, and another process that took the expired
lease over meanwhile ran the same session at the same time (the crash soak's
``overlap``, seed 7024). Now the next turn asks the store (renewing, or finding
the lease lost), so the other process is refused ``LEASE_HELD``.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from durability_kit import gated
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors._kernel._gate import Gate
from subagents.protocol import ErrorCode, SessionId, SubagentError

pytestmark = pytest.mark.timeout(120)

TTL = 3.0
#: How long the store makes the acquisition wait: past the lease's ttl.
WAIT = TTL + 1.0


@contextmanager
def _store_held(db: str, session: SessionId) -> Iterator[None]:
    """Another process's lock the session's lease acquisition must wait for, held
    for :data:`WAIT` seconds from a thread of its own (from outside the store)."""
    done = threading.Event()
    if db.startswith("postgresql"):
        import psycopg

        base, _, schema = db.partition("?schema=")
        conn: Any = psycopg.connect(base)
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (session.to_bytes(),))
    else:
        conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN IMMEDIATE")  # the write lock

    def hold() -> None:
        done.wait(WAIT)  # the length of the other process's hold, not an ordering
        conn.rollback()
        conn.close()

    holder = threading.Thread(target=hold, name="lock-holder")
    holder.start()
    try:
        yield
    finally:
        holder.join()


def test_a_lease_taken_after_a_long_wait_is_checked_before_its_turn(
    backend: Backend, db: str
) -> None:
    """L-7: runtime ``a`` resumes a session while the store makes it wait past the
    lease's ttl, then runs a turn of it (held at a gate). Runtime ``b`` then asks
    for the session: ``LEASE_HELD`` -- ``a``'s turn asked the store first, renewing
    its lease. It used to take the session over (the lease ``a`` wrote had expired
    as it was written) and run it beside ``a``'s turn."""
    gate = Gate("turn")
    with (
        Runtime(db, backend=backend, lease_ttl=TTL) as a,
        Runtime(db, backend=backend, lease_ttl=TTL) as b,
    ):
        for rt in (a, b):
            rt.models.register("gated", lambda _o: gated({"held": gate}), replace=True)
        first = a.spawn("gated")
        first.followup("first")
        assert first.wait_idle(10)
        sid = first.session_id
        first.dispose()
        a.sessions.flush()
        assert a.store is not None
        with _store_held(db, sid):
            agent = a.agents.resume(sid)  # waits WAIT seconds for the store
        agent.followup("held")
        assert gate.wait_reached(30)
        try:
            with pytest.raises(SubagentError) as err:
                b.agents.resume(sid)
            assert err.value.code == ErrorCode.LEASE_HELD
        finally:
            gate.release()
        assert agent.wait_idle(30)
