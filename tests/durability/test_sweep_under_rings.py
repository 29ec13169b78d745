"""A holder that keeps being rung still sweeps (R-DUR, L-7, L-8).

The mail pickup wakes for rings and sweeps -- asks the store for its sessions'
untaken messages and for orphans, sessions with accepted work and no live lease
-- every third of the lease ttl. It swept only after a whole period passed
*without* a ring: a runtime rung more often than that (a busy session another
process keeps sending to) never swept, so an orphan nobody else adopts kept its
accepted messages pending for as long as the rings went on.
"""

from __future__ import annotations

import errno
from pathlib import Path

from durability_kit import Noted, until, worker
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
    within a few sweep periods, while the rings go on. (The pacer adopts nothing:
    its sweep took the orphan now and then under load, and the test failed.)"""
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
    ran_there = Path(marks).read_text() if Path(marks).exists() else ""
    assert " late" not in ran_there  # nowhere else


def test_the_mail_task_outlives_a_failed_wait(backend: Backend, db: str) -> None:
    """A wait for rings that fails (a kernel error from the socket; before, also
    ``wait(0)`` when a round outlasted the sweep period) is logged and the mail
    task goes on: a message committed to the inbox of a session this runtime
    holds, by another process, still runs here. The task died with the error
    before, and that runtime never picked up mail, an interrupt or an orphan
    again."""
    with Runtime(db, backend=backend, lease_ttl=TTL) as a:
        noted = Noted()
        noted.register(a, "a", model="mark")
        held = a.spawn("mark", label="held").session_id
        assert a.mail is not None
        bell = a.mail.doorbell
        real, failed = bell.wait, []

        def wait(timeout: float | None) -> list[bytes] | None:
            if not failed:
                failed.append(timeout)
                raise OSError(errno.ENOBUFS, "no buffer space available")
            return real(timeout)

        bell.wait = wait  # type: ignore[method-assign]
        a.mail.rung(held)  # the wait under way returns; the next one fails
        assert until(a, lambda: bool(failed), 10)
        assert a.store is not None
        a.store.accept(held, [trusted_message(new_message_id(), "after", None)])
        a.mail.rung(held)
        assert noted.runs("after", ["a"], timeout=10)
