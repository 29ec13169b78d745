"""One activation across processes (L-7, issue 13 point 4), with real processes.

Worker processes (``mp_worker.py``) share one store: an SQLite file, or a
PostgreSQL server (the ``db`` fixture). Whoever holds a
session's lease runs its turns; the others commit what they send to its durable
inbox and wake the holder; a holder that releases the session with work waiting,
or stalls past its lease, has its work adopted by a process that can run it. The
checks: every message ran exactly once, turns of different processes never
overlapped (their start/end marks alternate), each sender's messages ran in the
order it sent them, and the log's sequence numbers are contiguous.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from durability_kit import Noted
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    SessionId,
    SubagentError,
    TurnEnd,
    TurnStart,
)

WORKER = Path(__file__).with_name("mp_worker.py")
TTL = 1.0  # seconds: a lease held by a stopped process expires quickly
# Where no process stops: a holder starved past its ttl on a loaded box loses its
# lease, and a turn whose end it could not commit then runs again (at least once,
# by design): p0-9 ran twice in a run beside two other full suites, with 1 s.
SEND_TTL = 4.0


def _worker(*args: str, host: str | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    if host is not None:
        env["SUBAGENTS_TEST_HOST"] = host  # the worker's leases name another machine
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _kill_when_ready(victim: subprocess.Popen[str]) -> None:
    """SIGKILL an ``accept`` worker once it said ``ready`` (or failed to)."""
    try:
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == "ready"
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.communicate()


def _stop_when(worker: subprocess.Popen[str], said: str) -> None:
    """SIGSTOP ``worker`` once it said ``said`` (a line on its stdout)."""
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == said
    os.kill(worker.pid, signal.SIGSTOP)


def _taking_over(rt: Runtime) -> Noted:
    """``rt`` runs the shared session's ``mark`` turns, noted as ``new``."""
    noted = Noted()
    noted.register(rt, "new")
    rt.models.register("mark", rt.models.require("note"), replace=True)
    return noted


def _env(backend: Backend) -> tuple[str, str]:
    return backend.name, str(TTL)


def _session(db: str, backend: Backend) -> SessionId:
    """A top-level ``mark`` session nobody holds (made, then its runtime closed)."""
    with Runtime(db, backend=backend) as rt:
        rt.models.register("mark", lambda _o: lambda turn: None)
        return rt.spawn("mark", label="shared").session_id


def _check_log(
    db: str, backend: Backend, sid: SessionId, cut_short: int | None = 0
) -> list[object]:
    """The contents of the session's turns, after checking the log is well formed
    (``cut_short`` turns ended ``failed`` by a crash, the rest completed)."""
    with Runtime(db, backend=backend) as rt:
        assert rt.store is not None
        records = rt.store.read(sid)
    assert [r.seq for r in records] == list(range(len(records)))  # no gap, no duplicate
    events = [r.event for r in records]
    starts = [e for e in events if isinstance(e, TurnStart)]
    ends = [e for e in events if isinstance(e, TurnEnd)]
    assert [e.turn for e in starts] == list(range(len(starts)))
    assert [e.turn for e in ends] == [e.turn for e in starts]
    if cut_short is not None:
        assert [e.stop_reason for e in ends].count("failed") == cut_short
    assert all(e.stop_reason in ("completed", "failed") for e in ends)
    return [e.content for e in events if isinstance(e, MessageEvent)]


def _check_marks(marks: Path) -> list[str]:
    """Turns never overlapped: every start is followed by its own end. Returns the
    contents in the order they ran."""
    lines = marks.read_text().splitlines()
    ran = []
    for start, end in zip(lines[::2], lines[1::2]):
        kind, who, content = start.split(" ", 2)
        assert (kind, end) == ("start", f"end {who} {content}"), lines
        ran.append(content)
    assert len(lines) % 2 == 0, lines
    return ran


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 4])
def test_processes_sending_to_one_session_run_each_message_once_never_interleaved(
    backend: Backend, db: str, tmp_path: Path, processes: int
) -> None:
    """Issue 13 point 4: 2 and 4 processes send to one session at once. Whichever
    holds it runs every message once; turns never interleave; per sender, in order."""
    marks = tmp_path / "marks"
    sid = _session(db, backend)
    count = 15
    total = count * processes
    ttl = str(SEND_TTL)
    procs = [
        _worker("send", db, sid, f"p{i}", str(count), str(total), str(marks), backend.name, ttl)
        for i in range(processes)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, (out, err)
        assert "Traceback" not in err, err
    returned = [line for out, _ in outs for line in out.split()]
    assert len(returned) == total
    ran = _check_marks(marks)
    assert Counter(ran) == Counter(f"p{i}-{k}" for i in range(processes) for k in range(count))
    for i in range(processes):
        mine = [c for c in ran if c.startswith(f"p{i}-")]
        assert mine == [f"p{i}-{k}" for k in range(count)]
    assert _check_log(db, backend, sid) == ran


@pytest.mark.slow
def test_a_stalled_holder_is_taken_over_and_loses_its_lease_when_it_wakes(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """Issue 13 point 4: the holder is SIGSTOPped; a message sent meanwhile is
    committed, and once the holder's lease expired this process adopts the
    session and runs it. SIGCONT: the old holder finds its lease lost, disposes
    its agent (``AGENT_DISPOSED`` after) and wrote nothing into the new epoch."""
    marks = tmp_path / "marks"
    sid = _session(db, backend)
    holder = _worker("hold", db, sid, "old", "-", "-", str(marks), *_env(backend))
    try:
        _stop_when(holder, "held")
        with Runtime(db, backend=backend, lease_ttl=TTL) as rt:
            noted = _taking_over(rt)
            rt.agents.send(sid, "while stopped")
            assert noted.wait_for(lambda items: len(items) == 1, timeout=30)
            assert noted.items() == [("new", "while stopped", False)]
            agent = rt.agents.get(sid)
            assert agent is not None
            os.kill(holder.pid, signal.SIGCONT)
            out, err = holder.communicate(timeout=60)
            assert holder.returncode == 0, (out, err)
            assert out.split() == ["AGENT_DISPOSED"], (out, err)
            agent.followup("after")
            assert noted.wait_for(lambda items: len(items) == 2)
            assert agent.wait_idle(10)
        assert not marks.exists()  # the old holder never ran a turn
        assert _check_log(db, backend, sid) == ["while stopped", "after"]
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.communicate()


@pytest.mark.slow
def test_a_killed_holder_is_taken_over_after_expiry_and_its_messages_replay(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """Issue 13 point 4: a holder SIGKILLed with a turn running and messages queued;
    a runtime on the same file, asked nothing, adopts the session once the dead
    holder's lease expired (its sweep) and replays every accepted message once,
    in order, flagged redelivered (the dead epoch had taken them)."""
    sid = _session(db, backend)
    count = 5
    victim = _worker("accept", db, sid, "-", str(count), "-", str(tmp_path / "m"), *_env(backend))
    _kill_when_ready(victim)
    with Runtime(db, backend=backend, lease_ttl=TTL) as rt:
        noted = _taking_over(rt)
        expected = ["first", *(f"m{i}" for i in range(count))]
        assert noted.wait_for(lambda items: len(items) >= len(expected), timeout=30)
        agent = rt.agents.get(sid)
        assert agent is not None
        assert agent.wait_idle(10)
        assert noted.items() == [("new", c, True) for c in expected]
    ran = _check_log(db, backend, sid, cut_short=None)
    # The turn the kill cut short is in the log (closed "failed") if its start was
    # written before the kill; then comes the replay, each message once.
    assert ran in (expected, ["first", *expected])


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"


def test_a_killed_holder_not_yet_reaped_counts_as_gone_at_once(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """A supervisor SIGKILLs its worker and resumes the worker's session before it
    reaps it: the worker is a zombie, which ``kill(pid, 0)`` still finds. Its lease
    (30 s to run) counts as gone at once, as a dead holder's of this host does: the
    resume takes the session over (it was ``LEASE_HELD`` until the reaping)."""
    sid = _session(db, backend)
    victim = _worker("accept", db, sid, "-", "2", "-", str(tmp_path / "m"), backend.name, "30")
    try:
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == "ready"
        os.kill(victim.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not _zombie(victim.pid):  # dead; nobody reaped it
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with Runtime(db, backend=backend, lease_ttl=30.0) as rt:
            rt.models.register("mark", lambda _o: lambda turn: None)
            agent = rt.agents.resume(sid)
            assert agent.wait_idle(10)
            assert [e.stop_reason for e in rt.sessions.turn_ends(sid)][-3:] == ["completed"] * 3
    finally:
        if victim.poll() is None:
            victim.kill()
        victim.communicate()


def test_a_holder_stopped_past_its_lease_starts_no_turn_after_it(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """A holder with follow-ups queued in memory is stopped (SIGSTOP) past its
    lease; this runtime takes the session over and runs every message; then the
    holder continues. It started the next message from its memory at once --
    one the new holder had completed, not even flagged redelivered -- and only
    its write after the turn failed. A turn now starts only under a lease known
    to be held: after a stall, the holder asks the store first, finds the lease
    gone, and runs nothing more."""
    sid = _session(db, backend)
    marks = tmp_path / "marks"
    count = 8
    stalled = _worker("stall", db, sid, "A", str(count), "-", str(marks), backend.name, str(TTL))
    try:
        _stop_when(stalled, "ready")
        with Runtime(db, backend=backend, lease_ttl=TTL) as rt:
            noted = _taking_over(rt)
            deadline = time.monotonic() + 30
            while True:  # the stopped holder's lease expires: a resume, or the sweep
                try:
                    agent = rt.agents.resume(sid)
                    break
                except SubagentError as exc:
                    found = rt.agents.get(sid)
                    if exc.code == ErrorCode.SESSION_EXISTS and found is not None:
                        agent = found
                        break
                    assert exc.code == ErrorCode.LEASE_HELD and time.monotonic() < deadline
                    rt.backend.sleep(0.1)
            assert agent.wait_idle(30)
            ran = [c for _, c, _ in noted.items()]
            assert ran and ran[-1] == f"m{count - 1}", ran
            before = marks.read_text().splitlines() if marks.exists() else []
            os.kill(stalled.pid, signal.SIGCONT)
            assert stalled.stdout.readline().strip() == "lost"
            after = marks.read_text().splitlines()[len(before) :]
            assert [line for line in after if line.startswith("start A")] == []
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
        if stalled.poll() is None:
            stalled.kill()
        stalled.communicate()


_RESUME = """
import sys
from subagents.actors import Runtime
from subagents.protocol import SubagentError
db, sid, backend = sys.argv[1:4]
with Runtime(db, backend=backend, lease_ttl=30.0) as rt:
    rt.models.register("mark", lambda _o: lambda turn: None)
    try:
        rt.agents.resume(sid)
        print("resumed")
    except SubagentError as exc:
        print(exc.code)
"""


def test_a_holder_in_another_pid_namespace_is_not_judged_by_its_pid(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """Two workers of one host name whose PID namespaces differ (containers sharing
    the host's network, ``PrivatePIDs``): the holder's pid means nothing in the
    other's namespace. The second took the live first's lease at once (its pid
    was not found there), and both ran the session's turns; now it waits for the
    lease as for another machine's holder: ``LEASE_HELD``."""
    import shutil

    if (
        shutil.which("unshare") is None
        or subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True
        ).returncode
    ):
        pytest.skip("no unshare --pid here (it needs root)")
    sid = _session(db, backend)
    holder = _worker("accept", db, sid, "-", "1", "-", str(tmp_path / "m"), backend.name, "30")
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        other = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _RESUME,
             db, str(sid), backend.name],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert other.stdout.split() == [ErrorCode.LEASE_HELD], other.stderr[-2000:]
    finally:
        holder.kill()
        holder.communicate()


@pytest.mark.slow
@pytest.mark.parametrize("asked", [True, False], ids=["followed-up", "swept"])
def test_a_killed_holders_continuable_child_runs_what_it_accepted(
    backend: Backend, db: str, tmp_path: Path, asked: bool
) -> None:
    """A holder SIGKILLed while its continuable child's turn runs, with follow-ups
    queued behind it. Another runtime on this host -- followed up by the parent's
    id, or asked nothing (its sweep) -- activates the tree and the child runs
    every accepted message once, in order. On PostgreSQL the dead holder's
    ``NOTIFY`` channel was taken for a live holder (a notify succeeds with nobody
    listening), so the child never ran again."""
    count = 3
    victim = _worker("tree", db, "-", "-", str(count), "-", str(tmp_path / "m"), *_env(backend))
    try:
        assert victim.stdout is not None
        ready, lead_id, child_id = victim.stdout.readline().split()
        assert ready == "ready"
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.communicate()
    noted = Noted()
    with Runtime(db, backend=backend, lease_ttl=TTL) as rt:
        noted.register(rt, "new")
        rt.models.register("stuck", rt.models.require("note"), replace=True)
        rt.models.register("mark", rt.models.require("note"), replace=True)
        expected = [f"m{i}" for i in range(count + 1)]
        if asked:
            rt.subagents.followup(SessionId(lead_id), SessionId(child_id), "after")
            expected.append("after")
        assert noted.wait_for(lambda items: len(items) >= len(expected), timeout=30), noted.items()
        assert rt.wait_idle(10)
        assert noted.contents() == expected


@pytest.mark.slow
def test_a_holder_on_another_host_is_taken_over_only_after_its_lease_expires(
    backend: Backend, pg_url: str, tmp_path: Path
) -> None:
    """Issue 14 point 5, two hosts simulated: a worker whose leases name another
    host holds a session on the shared PostgreSQL server (its own process, its own
    pools) and is SIGKILLed with messages queued. This host cannot see that
    process, so it must not judge it dead: resuming the session is ``LEASE_HELD``
    at once. Once the lease expired, the sweep adopts the session and replays every
    accepted message once, in order."""
    sid = _session(pg_url, backend)
    count = 3
    ttl = 3.0  # long enough to look before it expires, short for the test
    victim = _worker(
        "accept", pg_url, sid, "-", str(count), "-", str(tmp_path / "m"), backend.name,
        str(ttl), host="host-b",
    )  # fmt: skip
    _kill_when_ready(victim)
    noted = Noted()
    with Runtime(pg_url, backend=backend, lease_ttl=ttl) as rt:
        assert rt.store is not None
        lease = rt.store.get_lease(sid)
        assert lease is not None and lease.holder is not None
        assert lease.holder.startswith("host-b:")
        assert lease.expires > time.time()
        noted.register(rt, "new")
        rt.models.register("mark", rt.models.require("note"), replace=True)
        with pytest.raises(SubagentError) as info:
            rt.agents.resume(sid)  # on this host the pid would be seen dead: not there
        assert info.value.code == ErrorCode.LEASE_HELD
        expected = ["first", *(f"m{i}" for i in range(count))]
        assert noted.wait_for(lambda items: len(items) >= len(expected), timeout=30)
        agent = rt.agents.get(sid)
        assert agent is not None and agent.wait_idle(10)
        assert noted.items() == [("new", c, True) for c in expected]
