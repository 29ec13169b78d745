"""A holder that keeps being rung still sweeps (R-DUR, L-7, L-8).

The mail pickup wakes for rings and sweeps -- asks the store for its sessions'
untaken messages and for orphans, sessions with accepted work and no live lease
-- every third of the lease ttl. It swept only after a whole period passed
*without* a ring: a runtime rung more often than that (a busy session another
process keeps sending to) never swept, so an orphan nobody else adopts kept its
accepted messages pending for as long as the rings went on.
"""

from __future__ import annotations

from pathlib import Path

from durability_kit import Noted, worker
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import new_message_id, trusted_message

TTL = 1.5  # seconds: a sweep every 0.5 s


def test_an_orphan_is_adopted_while_rings_keep_coming(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """A worker process sends to a session this runtime holds every 0.05 s (each
    send rings it). Meanwhile a message is committed straight to the inbox of a
    session nobody holds, ringing nobody: only a sweep finds it. It runs here
    within a few sweep periods, while the rings go on."""
    with Runtime(db, backend=backend) as made:
        made.models.register("mark", lambda _o: lambda turn: None)
        orphan = made.spawn("mark", label="orphan").session_id  # released at close
    with Runtime(db, backend=backend, lease_ttl=TTL) as a:
        noted = Noted()
        noted.register(a, "a", model="mark")
        busy = a.spawn("mark", label="busy").session_id
        marks = str(tmp_path / "marks")
        args = ("pace", db, str(busy), "w", "400", "-", marks, backend.name, str(TTL))
        with worker("mp_worker.py", *args) as pacer:
            assert pacer.stdout is not None
            assert pacer.stdout.readline().strip()  # the rings have begun
            assert a.store is not None
            a.store.accept(orphan, [trusted_message(new_message_id(), "late", None)])
            assert noted.runs("late", ["a"], timeout=10)
            assert pacer.poll() is None  # the rings went on all along
