"""Leases across hosts whose wall clocks differ (PostgreSQL), with real processes.

A lease's expiry used to be the holder's wall clock plus the ttl, compared with
the contender's wall clock: a host whose clock ran ahead took over every live
holder's sessions, one whose clock ran behind had its own taken at once, and
one whose clock ran ahead held its leases that much longer once it died. Leases
are now measured by the store's one clock (the server's), so neither host's
clock matters. The workers (``clock_worker.py``) add a skew to every
``time.time()`` reading of theirs; their leases name another host, so no
process-liveness check can stand in for the expiry. On an SQLite file every
process reads one host's clock: there is no skew to test there.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from durability_kit import worker
from subagents.actors import Runtime, UserAuthority
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, SessionId, SubagentError

WORKER = Path(__file__).with_name("clock_worker.py")
HOUR = 3600.0

pytestmark = pytest.mark.timeout(90)


def _worker(
    mode: str, url: str, sid: SessionId, backend: Backend, ttl: float, skew: float
) -> subprocess.Popen[str]:
    env = dict(os.environ, SUBAGENTS_TEST_HOST="host-b")
    return subprocess.Popen(
        [sys.executable, str(WORKER), mode, url, sid, backend.name, str(ttl), str(skew)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _session(url: str, backend: Backend) -> SessionId:
    """A top-level ``mark`` session nobody holds (made, then its runtime closed)."""
    with Runtime(url, backend=backend) as rt:
        rt.models.register("mark", lambda _o: lambda turn: turn.content)
        return rt.spawn("mark", label="shared").session_id


def _held(holder: subprocess.Popen[str]) -> None:
    assert holder.stdout is not None
    line = holder.stdout.readline().strip()
    assert line == "held", (line, holder.stderr.read() if line == "" else "")


def _kept(holder: subprocess.Popen[str]) -> str:
    out, err = holder.communicate("\n", timeout=60)
    assert holder.returncode == 0, (out, err)
    return out.strip()


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def test_a_contender_whose_clock_runs_ahead_takes_over_no_live_holder(
    backend: Backend, pg_url: str
) -> None:
    """R-DUR-3 (one activation across processes), clock skew: a process whose clock
    runs an hour ahead resumes a session another live process holds (ttl 30 s).
    It used to find the lease expired and take it over; it is ``LEASE_HELD``, and
    the holder keeps its session."""
    sid = _session(pg_url, backend)
    holder = _worker("hold", pg_url, sid, backend, 30.0, 0.0)
    try:
        _held(holder)
        contender = _worker("resume", pg_url, sid, backend, 30.0, HOUR)
        out, err = contender.communicate(timeout=60)
        assert out.strip() == ErrorCode.LEASE_HELD, (out, err)
        assert _kept(holder) == "kept"
    finally:
        _stop(holder)


def test_a_holder_whose_clock_runs_behind_keeps_its_session(backend: Backend, pg_url: str) -> None:
    """R-DUR-3, clock skew: the holder's clock runs an hour behind. Its lease used
    to be written expired an hour ago, so this process (its clock right) took the
    session over at once and the holder lost it; now the resume is ``LEASE_HELD``
    and the holder keeps its session."""
    sid = _session(pg_url, backend)
    holder = _worker("hold", pg_url, sid, backend, 30.0, -HOUR)
    try:
        _held(holder)
        with Runtime(pg_url, backend=backend, lease_ttl=30.0) as rt:
            rt.models.register("mark", lambda _o: lambda turn: turn.content)
            with pytest.raises(SubagentError) as info:
                rt.agents.resume(sid)
            assert info.value.code == ErrorCode.LEASE_HELD
        assert _kept(holder) == "kept"
    finally:
        _stop(holder)


def test_a_dead_holder_whose_clock_ran_ahead_is_taken_over_after_its_ttl(
    backend: Backend, pg_url: str
) -> None:
    """R-DUR-3 (no lease held for ever), clock skew: a holder whose clock runs an
    hour ahead is SIGKILLed. Its lease used to stay live for the hour its clock
    was ahead; it now expires a ttl (2 s) after its last renewal, and this
    process resumes the session."""
    sid = _session(pg_url, backend)
    ttl = 2.0
    holder = _worker("hold", pg_url, sid, backend, ttl, HOUR)
    try:
        _held(holder)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.communicate()
    with Runtime(pg_url, backend=backend, lease_ttl=ttl) as rt:
        rt.models.register("mark", lambda _o: lambda turn: turn.content)
        deadline = time.monotonic() + 30  # a generous bound on "a ttl"
        while True:
            try:
                agent = rt.agents.resume(sid)
                break
            except SubagentError as exc:
                assert exc.code == ErrorCode.LEASE_HELD, exc
                assert time.monotonic() < deadline, "the dead holder's lease outlived its ttl"
                rt.backend.sleep(0.1)
        assert agent.followup("after") is not None
        assert agent.wait_idle(20)


def test_an_interrupt_asked_on_a_clock_behind_the_holders_cuts_its_turn(
    backend: Backend, pg_url: str
) -> None:
    """R-INT-8 across hosts, clock skew: a worker holds a child whose turn runs; this
    process, its clock a minute behind, interrupts it. "When it was asked" was its
    own clock's reading, compared with the turn's start on the holder's: the turn
    seemed to begin after the interrupt and was left running (the interrupt lost).
    Both now read the store's clock: the turn is cut."""

    def behind() -> dt.datetime:
        return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)

    with worker("interrupt_worker.py", pg_url, backend.name) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        root, child = proc.stdout.readline().split()
        with Runtime(pg_url, backend=backend, clock=behind) as rt:
            rt.subagents.interrupt(child, UserAuthority(root))
        assert proc.stdout.readline().split() == ["cancelled", root]
        proc.stdin.close()
        assert proc.wait(30) == 0
