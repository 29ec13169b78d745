"""A message taken from the durable inbox as its turn starts, whose take the store
could not record (PostgreSQL, both backends).

A follow-up by the parent's id to a child that is not resident is committed taken
by nobody and routed; one that meets the child's materialization after the
resume read its inbox is delivered at publication, and its turn first records it
taken by the new activation (``hand_over``), so that a later activation knows it
may have run (``redelivered``). A take that failed -- the server going away, a
row lock held past ``lock_timeout_s`` -- used to run the message anyway: when the
turn's own writes failed as well, the next activation found it untaken and ran
it again, not flagged ``redelivered``. Now the activation stops there, as one
whose write failed, and the next one runs the message.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from durability_kit import Noted, until, waits_behind
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel import Gate
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId
from subagents.store import PostgresStore

pytestmark = pytest.mark.timeout(120)


#: The late message's content: found in its inbox row's payload by its bytes, so
#: long enough that no other row holds them. (It was "x": one byte, 0x78, which a
#: random session id in every row's source -- the parent's -- holds about one run in
#: 30, and the lock below then met three rows.)
LATE = "the late message"


def _lock_inbox_row(pg_url: str, session: SessionId, content: str) -> psycopg.Connection[Any]:
    """A transaction of another client holding the row lock of the inbox row of
    the message ``content`` (its payload holds the text: make it one no id can)."""
    base, _, schema = pg_url.partition("?schema=")
    conn = psycopg.connect(base)
    conn.execute(f'SET search_path TO "{schema}"')
    rows = conn.execute(
        "SELECT 1 FROM inbox WHERE session = %s AND position(%s in body) > 0 FOR UPDATE",
        (session.to_bytes(), content.encode()),
    ).fetchall()
    if len(rows) != 1:
        conn.close()  # its locks held would keep the schema's drop waiting for good
    assert len(rows) == 1, rows
    return conn


def test_a_message_whose_take_was_not_recorded_runs_once(backend: Backend, pg_url: str) -> None:
    """R-FUP-1, R-ERR-1, R-DUR-3: ``x`` reaches the child's publication untaken;
    its take and the end of its turn wait for a row lock another client holds,
    past the lock timeout. ``x`` used to run in that activation and again,
    unflagged, in the next; now it runs once."""
    noted = Noted()
    gate = Gate("materializing")
    armed = threading.Event()

    def contribution(_scope: Any) -> None:
        if armed.is_set():
            armed.clear()
            gate.pass_through()

    store = PostgresStore(pg_url, lock_timeout_s=1)
    with Runtime(store, backend=backend) as rt:
        noted.register(rt, "rt")
        parent = rt.spawn("echo", label="parent")
        child, _ = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=parent, provider="local", prompt="first", label="kid", model="note"
            )
        )
        assert noted.runs("first", ["rt"], 30)
        assert until(rt, lambda: rt.agents.get(child) is None, 30)  # settled, released
        rt.subagents.register_continuable_setup(contribution)
        armed.set()
        errors: list[BaseException] = []

        def follow(content: str) -> None:
            try:
                rt.subagents.followup(parent.session_id, child, content)
            except BaseException as exc:  # looked at below
                errors.append(exc)

        resuming = rt.backend.spawn(follow, "y")
        assert gate.wait_reached(30)  # the resume read the inbox: y, not x
        late = rt.backend.spawn(follow, LATE)
        assert until(rt, lambda: len(store.pending(child)) == 2, 30)  # x committed
        # ... and waiting for the publication (routed after it, x finds the
        # activation settled and resumes the child itself: its take fails there).
        assert until(rt, lambda: waits_behind(rt, child, LATE), 30)
        locker = _lock_inbox_row(pg_url, child, LATE)
        try:
            gate.release()
            assert resuming.join(30) is not False
            assert late.join(30) is not False
            # The child stops: a write of it failed (the take of x, or its turn's end).
            assert until(rt, lambda: bool(rt.sessions.statistics().persistence_failures), 30)
            stopped = rt.agents.get(child)
        finally:
            locker.rollback()
            locker.close()
        assert not errors, errors
        # Wait for its stop (its lease's release): a follow-up committed taken by the
        # stopping activation, given back only after a new one read it, is flagged
        # redelivered -- a race of its own, not this test's.
        assert until(rt, lambda: stopped is None or stopped.disposed_now(), 30)
        rt.subagents.followup(parent.session_id, child, "z")
        assert noted.wait_for(lambda items: ("rt", "z", False) in items, 30), noted.items()
        xs = [r for _, c, r in noted.items() if c == LATE]
        assert xs[:1] == [False] and all(xs[1:]), noted.items()  # ran again unflagged
