"""A worker of another host killed on a shared PostgreSQL store: its accepted work
is taken up once its listening connection stayed gone for a grace period, not
at its lease's expiry (L-8, R-DUR-*; issue 13: "durable across crashes and
processes"; docs/postgres.md, "dead holders").

The worker (``start_worker.py blocked``, lease ttl an hour) names another host in
its holder id (``SUBAGENTS_TEST_HOST``): a pid check says nothing of it here, as
for a worker in another container or on another machine. It holds a root and a
continuable child whose turn is running, and is killed with SIGKILL. The runtime
here (ttl 3 s: a sweep a second, a grace of a second) is asked nothing: its
sweep finds the child's accepted message under the lease of a holder the server
no longer hears, again a grace later, and runs it as a redelivery. A worker
that lives keeps its work -- even when the server cuts its listening
connection: it reconnects within the grace.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from durability_kit import beside_a_worker, sweep_answers, until
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId

TTL = 3.0  # the sweeping runtime's: a sweep a second, unheard_grace(3.0) == 1.0


def _holder(rt: Runtime, child: str) -> str | None:
    assert rt.store is not None
    lease = rt.store.get_lease(child)
    return None if lease is None else lease.holder


def test_a_killed_foreign_holders_work_runs_a_grace_after_it_is_unheard(
    backend: Backend,
    pg_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGKILL while the child's turn runs: the runtime here runs it again (a
    redelivery) within a few sweeps, found by the unheard holders' question (the
    pid question cannot judge another host), though the lease has an hour to go."""
    caplog.set_level(logging.INFO, logger="subagents")
    unheard = sweep_answers(monkeypatch, "unheard")
    abandoned = sweep_answers(monkeypatch, "abandoned")
    with beside_a_worker(backend, pg_url, tmp_path, TTL, host="another-host~0.0") as (
        proc, child, rt, noted,
    ):  # fmt: skip
        holder = _holder(rt, child)
        assert holder is not None and holder.startswith("another-host~0.0:")
        proc.kill()
        assert noted.wait_for(lambda items: len(items) >= 1, 30), unheard
        assert noted.items() == [("here", "first", True)]
        assert SessionId(child) in [sid for found in unheard for sid in found]
        assert SessionId(child) not in [sid for found in abandoned for sid in found]
        assert _holder(rt, child) == rt.sessions.leases.holder.id
    said = [r.getMessage() for r in caplog.records if "is gone (unheard" in r.getMessage()]
    assert said and all(holder in line for line in said), caplog.text


def test_a_live_foreign_holder_keeps_its_work_though_its_connection_is_cut(
    backend: Backend, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker lives: sweep after sweep judges nobody gone -- also after the
    server ended its listening session twice (it reconnects at once, within the
    grace) -- and nothing of its runs here."""
    unheard = sweep_answers(monkeypatch, "unheard")
    with beside_a_worker(backend, pg_url, tmp_path, TTL, host="another-host~0.0") as (
        proc, child, rt, noted,
    ):  # fmt: skip
        assert until(rt, lambda: len(unheard) >= 2, 30)
        holder = _holder(rt, child)
        assert rt.store is not None
        lease = rt.store.get_lease(child)
        assert lease is not None and lease.wake is not None
        with psycopg.connect(pg_url.split("?")[0], autocommit=True) as admin:
            for _cut in range(2):
                seen = len(unheard)
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s",
                    (lease.wake[3:],),
                )
                assert until(rt, lambda seen=seen: len(unheard) >= seen + 2, 30)
        assert until(rt, lambda: len(unheard) >= 8, 30)
        assert all(found == [] for found in unheard), unheard
        assert noted.items() == []
        assert _holder(rt, child) == holder
        assert proc.poll() is None


def test_a_closing_runtime_is_heard_until_its_last_lease_went_back(
    backend: Backend, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close()`` disposes its agents -- for long, with many of them -- before it
    hangs its listener up: as each agent gives its session up, the server still
    shows the runtime's listening connection, so no other host judges it gone
    meanwhile and takes over a session whose disposal is still writing. (It
    hung up first.)"""
    from subagents.actors import ContinuableStartSpec
    from subagents.actors._agents._sessions import SessionService

    shown: list[bool] = []
    real = SessionService.release

    def release(self: SessionService, *args: Any, **kwargs: Any) -> None:
        with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (channel,)
            ).fetchone()
        shown.append(row is not None and row[0] == 1)
        real(self, *args, **kwargs)

    rt = Runtime(pg_url, backend=backend, keep_warm=float("inf"))
    try:
        assert rt.mail is not None
        channel = rt.mail.address[3:]
        assert channel.startswith("subagents_heard_")
        root = rt.spawn("echo", label="root")
        for i in range(3):
            rt.subagents.start_continuable(
                ContinuableStartSpec(parent=root, provider="local", prompt="p", label=f"c{i}")
            )
        assert rt.wait_idle(30)
        monkeypatch.setattr(SessionService, "release", release)
    finally:
        rt.close()
    assert len(shown) == 4 and all(shown), shown
    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:  # then hung up
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        end = time.monotonic() + 10
        while (row := conn.execute(query, (channel,)).fetchone()) and row[0]:
            assert time.monotonic() < end, "the listener was left open"
            time.sleep(0.02)
