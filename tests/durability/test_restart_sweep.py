"""A runtime sweeps the store as soon as it opens, not a sweep period later (L-8,
R-DUR-*; issue 13: "durable across crashes and processes").

A worker process (``start_worker.py blocked``, lease ttl an hour) holds a root and
a continuable child whose turn is running, and is killed with SIGKILL; the
worker a supervisor restarts in its place opens a runtime on the store *after*
the kill and is asked nothing. Its mail task used to sweep first a third of its
lease ttl after it started (20 s here, 10 s with the default ttl): the cut-short
turn waited that long although the dead holder could be seen at once. Now the
first sweep runs a second after the opening (the opener's second: to register
its models and resume its own sessions before a sweep adopts them), and a model
or provider registered after a sweep that could not activate what it found has
the mail task sweep again at once.

What may race the first sweep -- the user resuming the root right away, a close
right after opening, runtimes opened and closed in a loop -- keeps one
activation per session and never hangs the close.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from durability_kit import Noted, blocked, until, worker
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId

TTL = 60.0  # the restarted runtime's: a sweep every 20 s
SOON = 10.0  # well inside one sweep period, generous on a loaded box


@contextmanager
def _killed_worker(backend: Backend, db: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``(root, child)`` of a worker killed (and reaped, as a supervisor does) while
    the child's turn ran; their leases have an hour to go."""
    args = (db, backend.name, str(tmp_path / "m"), "blocked", "3600")
    with worker("start_worker.py", *args) as proc:
        root, child = blocked(proc)
        proc.kill()
        proc.wait()
        yield root, child


def _held_by(rt: Runtime, sid: str) -> bool:
    assert rt.store is not None
    lease = rt.store.get_lease(sid)
    return lease is not None and lease.holder == rt.sessions.leases.holder.id


def test_a_restarted_worker_runs_the_killed_ones_work_at_once(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """Opened after the kill, asked nothing: the cut-short turn runs again (a
    redelivery) within a few seconds, not a sweep period after the start."""
    with _killed_worker(backend, db, tmp_path) as (_root, child):
        started = time.monotonic()
        with Runtime(db, backend=backend, lease_ttl=TTL) as rt:
            noted = Noted()
            noted.register(rt, "here", "block")
            assert noted.wait_for(lambda items: len(items) >= 1, SOON), "no sweep yet"
            assert time.monotonic() - started < TTL / 3
            assert noted.items() == [("here", "first", True)]
            assert _held_by(rt, child)


def test_a_model_registered_after_the_first_sweep_is_not_waited_for_a_period(
    backend: Backend, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first sweep ran before the child's model was registered (it could not
    activate the child); the registration has the mail task sweep again, and the
    turn runs within a few seconds."""
    looked: list[SessionId] = []
    real = Runtime._orphan

    def orphan(self: Runtime, session_id: SessionId) -> None:
        real(self, session_id)
        looked.append(session_id)  # after the attempt, whatever it came to

    monkeypatch.setattr(Runtime, "_orphan", orphan)
    with (
        _killed_worker(backend, db, tmp_path) as (_root, child),
        Runtime(db, backend=backend, lease_ttl=TTL) as rt,
    ):
        assert until(rt, lambda: SessionId(child) in looked, SOON)
        noted = Noted()
        noted.register(rt, "here", "block")
        assert noted.wait_for(lambda items: len(items) >= 1, SOON), "no sweep again"
        assert noted.items() == [("here", "first", True)]
        assert _held_by(rt, child)


def test_a_restart_script_resumes_its_own_root_before_any_sweep(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """The restart script's own pattern -- open the runtime, register its models,
    resume its root -- gets the root (no sweep adopted it first: not the first, a
    second after the opening, nor one the registration asked for), and the first
    sweep then runs the child's cut-short turn once, below it. Three rounds."""
    for _ in range(3):
        with (
            _killed_worker(backend, db, tmp_path) as (root, child),
            Runtime(db, backend=backend, lease_ttl=TTL) as rt,
        ):
            noted = Noted()
            noted.register(rt, "here", "block")
            mine = rt.agents.resume(root)
            assert noted.wait_for(lambda items: len(items) >= 1, SOON), "no sweep yet"
            assert noted.items() == [("here", "first", True)]
            assert rt.agents.get(root) is mine and not mine.disposed
            assert _held_by(rt, child)


def test_a_restart_script_slower_than_the_first_sweep_still_gets_its_root(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """R-RES-2, R-DUR-3: the restart script's setup outlasts the first sweep, which
    adopted the root to run the child's cut-short turn below it. The script's
    ``resume`` of the root returns that live agent (it was ``SESSION_EXISTS``, and
    a script had to know to call ``agents.get``), the script's from then on: no
    longer an adoption, never let go once quiet. The turn ran once. Three rounds."""
    for _ in range(3):
        with (
            _killed_worker(backend, db, tmp_path) as (root, _child),
            Runtime(db, backend=backend, lease_ttl=TTL, adopted_grace=TTL) as rt,
        ):
            noted = Noted()
            noted.register(rt, "here", "block")
            assert noted.wait_for(lambda items: len(items) >= 1, SOON), "no sweep yet"
            assert until(rt, lambda: rt.agents.adopted.adopted(SessionId(root)), SOON)
            mine = rt.agents.resume(root)
            assert rt.agents.get(root) is mine and not mine.disposed
            assert not rt.agents.adopted.adopted(SessionId(root))
            assert rt.wait_idle(SOON)
            assert noted.items() == [("here", "first", True)]
            assert rt.agents.get(root) is mine and not mine.disposed


def test_a_resume_right_after_opening_meets_the_first_sweep_once(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """The user resumes the root as the first sweep adopts it: one activation --
    the user's, or the sweep's handed to the user by ``resume`` -- and the child's
    turn runs once, below it."""
    with (
        _killed_worker(backend, db, tmp_path) as (root, _child),
        Runtime(db, backend=backend, lease_ttl=TTL) as rt,
    ):
        noted = Noted()
        noted.register(rt, "here", "block")
        mine = rt.agents.resume(root)
        assert rt.agents.get(root) is mine
        assert noted.wait_for(lambda items: len(items) >= 1, SOON)
        assert rt.wait_idle(SOON)
        assert noted.items() == [("here", "first", True)]
        assert rt.agents.get(root) is mine and not mine.disposed


def test_runtimes_opened_and_closed_at_once_leave_the_work_to_the_next(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """Runtimes opened and closed at once, in a loop, as their first sweeps start:
    each close returns, leaving no lease held by a runtime that is gone; the one
    opened after them runs the turn."""
    with _killed_worker(backend, db, tmp_path) as (root, child):
        for _ in range(4):
            rt = Runtime(db, backend=backend, lease_ttl=TTL)
            holder = rt.sessions.leases.holder.id
            began = time.monotonic()
            rt.close()
            assert time.monotonic() - began < 30
            with Runtime(db, backend=backend, lease_ttl=TTL) as look:
                assert look.store is not None
                for sid in (root, child):
                    lease = look.store.get_lease(sid)
                    assert lease is None or lease.holder != holder
        with Runtime(db, backend=backend, lease_ttl=TTL) as rt:
            noted = Noted()
            noted.register(rt, "here", "block")
            assert noted.wait_for(lambda items: len(items) >= 1, SOON)
            assert noted.items() == [("here", "first", True)]
