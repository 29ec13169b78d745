"""A killed worker's accepted work is taken up at the next sweep, not at its lease's
expiry (L-8, R-DUR-*; issue 13: "durable across crashes and processes").

A worker process (``start_worker.py blocked``, lease ttl an hour) holds a root and
a continuable child whose turn is running, and is killed with SIGKILL. Another
runtime on the store -- a sibling worker, or the one a supervisor restarts in
its place -- is asked nothing: its mail sweep (every third of its own ttl) finds
the child's accepted message under a lease of a holder of this host whose
process ended, takes the lease over and runs the message again, as a
redelivery. It used to wait for the dead lease's expiry: an hour here, 30 s by
default. A holder that is alive keeps its work, sweep after sweep.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from durability_kit import beside_a_worker, sweep_answers, until
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId

TTL = 3.0  # the sweeping runtime's: a sweep a second


def test_a_killed_holders_work_runs_at_the_next_sweep_unasked(
    backend: Backend, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL while the child's turn runs: the other runtime runs it again (a
    redelivery) within a few sweeps, though the dead lease has an hour to go."""
    answers = sweep_answers(monkeypatch, "abandoned")
    with beside_a_worker(backend, db, tmp_path, TTL) as (proc, child, rt, noted):
        proc.kill()  # (left unreaped: a zombie's holder counts as ended too)
        assert noted.wait_for(lambda items: len(items) >= 1, 30), answers
        assert noted.items() == [("here", "first", True)]
        assert SessionId(child) in [sid for found in answers for sid in found]
        assert rt.store is not None
        lease = rt.store.get_lease(child)
        assert lease is not None and lease.holder == rt.sessions.leases.holder.id


def test_a_live_holders_work_stays_with_it(
    backend: Backend, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker is alive (its turn still running): sweep after sweep finds no
    ended holder, and nothing of its runs here."""
    answers = sweep_answers(monkeypatch, "abandoned")
    with beside_a_worker(backend, db, tmp_path, TTL) as (proc, child, rt, noted):
        assert until(rt, lambda: len(answers) >= 3, 30)
        assert answers[:3] == [[], [], []]
        assert noted.items() == []
        assert rt.store is not None
        lease = rt.store.get_lease(child)
        assert lease is not None and lease.holder != rt.sessions.leases.holder.id
        assert proc.poll() is None
