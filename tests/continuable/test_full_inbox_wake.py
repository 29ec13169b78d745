"""A bounded child's inbox left full by a runtime that closed, followed up by its
parent resumed (live) in a new one: the refusal must wake the child.

The store refuses a follow-up to a full inbox of a child not resident here; the
messages filling it wait for nobody until the child is activated again (the
runtime that accepted them closed). A follow-up by the parent's id where the
parent is not live has always woken the child on a refusal
(``test_bounded_inbox.py``); one by the parent live here did not, so a
``wait_for_room`` never saw a place open. The killed-process case is in
``tests/durability/test_full_inbox_crash.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from continuable_kit import left_full
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend


@pytest.mark.parametrize("by", ["parent", "parent id"])
def test_a_full_inbox_nobody_runs_is_woken_by_its_live_parents_followup(
    backend: Backend, tmp_path: Path, by: str
) -> None:
    """Strict, after a restart: a child bounded at two messages holds its cut
    prompt and a follow-up in its durable inbox; its parent is resumed here (live)
    and follows it up with ``wait_for_room`` -- by the Agent, or by its id (the
    ordinary follow-up: it is live here). The refusal used to wake nothing on this
    path, so no place opened and the wait ended ``INBOX_FULL``; now it wakes the
    child, the waiting messages run, and the follow-up is accepted and runs after
    them. R-FUP-1, R-FUP-5, R-FUP-8."""
    db = str(tmp_path / "full.db")
    pid, cid, worker = left_full(db, backend)
    # A sweep (every lease_ttl / 3) would wake it too, in time: not within the wait.
    with Runtime(db, backend=backend, lease_ttl=120) as rt:
        rt.models.register("worker", lambda _o: worker)
        assert len(rt.sessions.pending(cid)) == 2
        live = rt.agents.resume(pid)
        rt.subagents.followup(live if by == "parent" else pid, cid, "b", wait_for_room=15)
        assert rt.wait_idle(20)
        outputs = [e.output for e in rt.sessions.turn_ends(cid)]
        assert outputs[-3:] == ["did block", "did a", "did b"], outputs
