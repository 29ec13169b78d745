"""Workers in other PID and network namespaces on one SQLite file -- containers
mounting one volume: a killed one's work is taken up at the next sweep, and a
follow-up rings a live one at once (L-8, R-DUR-*; issue 13: "durable across
crashes and processes"; docs/durability.md, "Containers").

The worker (``start_worker.py``, lease ttl an hour: it sweeps every 20 minutes,
so nothing it runs within a test's time was found by its own sweep) runs under
``unshare --pid --net --mount-proc``: its pids mean nothing here, its holder's
host is not this one, and a doorbell in the abstract socket namespace would not
reach it. What reaches across is the file's meeting place, ``<db>-wake/``: the
worker's lock there ends with its process, and its doorbell is a socket file
there. Skipped where namespaces cannot be made (not root, or no ``unshare``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from durability_kit import beside_a_worker, sweep_answers, until, worker
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId

TTL = 3.0  # the sweeping runtime's: a sweep a second

#: Runs a command as PID 1 of a new PID namespace, in a network namespace of its
#: own (``--kill-child``: it dies with ``unshare``, should the test end first).
INSIDE = ("unshare", "--pid", "--net", "--mount-proc", "--fork", "--kill-child")


def _namespaces_here() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run([*INSIDE, "true"], capture_output=True, timeout=30)
    return done.returncode == 0


pytestmark = pytest.mark.skipif(
    not _namespaces_here(), reason="cannot make PID and network namespaces here"
)


def _worker_pid(proc: subprocess.Popen[Any]) -> int:
    """The pid (in this namespace) of the Python worker ``unshare`` forked."""
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
        (pid,) = f.read().split()
    return int(pid)


def _db(tmp_path: Path) -> str:
    return str(tmp_path / "shared.db")


def test_a_killed_holder_in_another_namespace_has_its_work_run_at_the_next_sweep(
    backend: Backend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGKILL to the worker (not to ``unshare``) while the child's turn runs: the
    runtime here, asked nothing, runs the message again (a redelivery) within a
    few sweeps -- found by the ended presences' question, not the pid question --
    though the lease has an hour to go. Before the presence lock, this waited
    for the lease's expiry."""
    caplog.set_level(logging.INFO, logger="subagents")
    ended = sweep_answers(monkeypatch, "ended")
    abandoned = sweep_answers(monkeypatch, "abandoned")
    with beside_a_worker(backend, _db(tmp_path), tmp_path, TTL, inside=INSIDE) as (
        proc, child, rt, noted,
    ):  # fmt: skip
        assert rt.store is not None
        lease = rt.store.get_lease(child)
        assert lease is not None and lease.wake is not None
        assert lease.wake.startswith(_db(tmp_path) + "-wake/")
        holder = lease.holder
        assert holder is not None and not holder.startswith(rt.sessions.leases.holder.kin)
        os.kill(_worker_pid(proc), signal.SIGKILL)
        assert noted.wait_for(lambda items: len(items) >= 1, 30), ended
        assert noted.items() == [("here", "first", True)]
        assert SessionId(child) in [sid for found in ended for sid in found]
        assert SessionId(child) not in [sid for found in abandoned for sid in found]
        lease = rt.store.get_lease(child)
        assert lease is not None and lease.holder == rt.sessions.leases.holder.id
    said = [r.getMessage() for r in caplog.records if "presence lock is free" in r.getMessage()]
    assert said and all(holder in line for line in said), caplog.text


def test_a_live_holder_in_another_namespace_keeps_its_work(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker lives: sweep after sweep finds no ended presence (the worker's
    lock is held), and nothing of its runs here."""
    ended = sweep_answers(monkeypatch, "ended")
    with beside_a_worker(backend, _db(tmp_path), tmp_path, TTL, inside=INSIDE) as (
        proc, child, rt, noted,
    ):  # fmt: skip
        assert until(rt, lambda: len(ended) >= 3, 30)
        assert ended[:3] == [[], [], []]
        assert noted.items() == []
        assert rt.store is not None
        lease = rt.store.get_lease(child)
        assert lease is not None and lease.holder != rt.sessions.leases.holder.id
        assert proc.poll() is None


def _turns(rt: Runtime, sid: str) -> int:
    assert rt.store is not None
    return sum(1 for r in rt.store.read(sid) if r.event.type == "turn/end")


def test_a_send_rings_a_holder_in_another_network_namespace(
    backend: Backend, tmp_path: Path
) -> None:
    """A ``send`` here to the root the worker holds is committed to its inbox and
    rings its doorbell -- a socket file, reached from this network namespace --
    so the worker runs it at once, not at its sweep 20 minutes later. Ten sends
    in a row, each waited for."""
    db = _db(tmp_path)
    args = (db, backend.name, str(tmp_path / "m"), "root", "3600")
    with worker("start_worker.py", *args, inside=INSIDE) as proc:
        assert proc.stdout is not None
        root = proc.stdout.readline().strip()
        assert root, proc.stderr.read() if proc.stderr else ""
        with Runtime(db, backend=backend) as rt:
            assert rt.store is not None
            lease = rt.store.get_lease(root)
            assert lease is not None and lease.wake is not None
            assert lease.wake.startswith(db + "-wake/")
            for n in range(10):
                before = _turns(rt, root)
                rt.agents.send(SessionId(root), f"hello {n}")
                assert until(rt, lambda before=before: _turns(rt, root) > before, 20), n
            lease = rt.store.get_lease(root)
            assert lease is not None and lease.holder != rt.sessions.leases.holder.id
        assert proc.poll() is None
