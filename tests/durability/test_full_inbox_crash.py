"""A bounded child's inbox left full by a killed process, followed up by its parent
resumed in another one.

The killed process's child held its prompt and a follow-up, both in its durable
inbox: two of two places. Nothing runs them until the child is activated again.
A follow-up by the parent resumed here (live), with ``wait_for_room``, must wake
the child -- the refusal wakes it, as a follow-up by the parent's id does where
the parent is not live -- or no place ever opens (the sweep adopts the child
only once the dead holder's lease expired, beyond the wait).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from durability_kit import Noted, worker
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId


@pytest.mark.parametrize("by", ["parent", "parent id"])
def test_a_full_inbox_left_by_a_killed_process_is_woken_by_the_live_parent(
    backend: Backend, tmp_path: Path, by: str
) -> None:
    """Strict: a worker leaves a child bounded at two messages full (its prompt
    ``m0`` running, ``m1`` waiting) and is SIGKILLed. Here the parent is resumed
    and follows the child up with ``wait_for_room`` -- by the Agent, or by its id
    (the parent is live here: the ordinary follow-up). That was ``INBOX_FULL``
    after the whole wait, nothing having run the waiting messages; now the
    refusal wakes the child (the dead holder's lease taken over), ``m0`` and
    ``m1`` run again, and the follow-up is accepted and runs after them.
    R-FUP-1, R-FUP-5, R-FUP-8."""
    db = str(tmp_path / "full.db")
    with worker("full_inbox_worker.py", db, backend.name) as victim:
        assert victim.stdout is not None
        ready, lead_id, child_id = victim.stdout.readline().split()
        assert ready == "ready"
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
    noted = Noted()
    # A sweep (every lease_ttl / 3) would adopt the child too: not within the wait.
    with Runtime(db, backend=backend, lease_ttl=120) as rt:
        noted.register(rt, "here")
        rt.models.register("stuck", rt.models.require("note"), replace=True)
        rt.models.register("lead", rt.models.require("note"), replace=True)
        cid = SessionId(child_id)
        assert len(rt.sessions.pending(cid)) == 2
        lead = rt.agents.resume(SessionId(lead_id))
        parent = lead if by == "parent" else lead_id
        rt.subagents.followup(parent, cid, "late", wait_for_room=15)
        assert noted.wait_for(lambda items: len(items) >= 3, timeout=20), noted.items()
        assert rt.wait_idle(10)
        assert noted.contents() == ["m0", "m1", "late"]
