"""A runtime made before ``fork()`` (gunicorn ``--preload``, multiprocessing's fork
start method, ``gevent.fork``): the child's copy belongs to the parent.

Each case runs ``fork_worker.py`` in a real subprocess, on both backends, on an
SQLite file and on PostgreSQL:

* every call on the inherited runtime, its agents, its session service and its
  store raises ``WRONG_PROCESS`` at once -- nothing hangs, nothing is accepted,
  run or written twice -- and ``close()`` lets the copy go without touching what
  the parent holds; the child exits the usual way and its exit handlers close
  nothing of the parent's (its PostgreSQL connections stay up);
* messages the parent accepted and had not run when it forked run once, in the
  parent: the copy's actors, lease renewals and wake-ups never run in the child,
  even while its hub runs, and it logs nothing;
* a runtime the child makes of its own works beside the parent's (a worker per
  process), and cannot take the session the parent holds (``LEASE_HELD``) --
  also when the parent forks while its threads write and read the store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from subagents.actors._kernel._backend import Backend

WORKER = Path(__file__).with_name("fork_worker.py")

#: What the child's calls must answer (everything but the closes refuses).
CLOSES = ("close", "close_again", "store_close")


def _run(backend: Backend, db: str, pids: Path, mode: str) -> tuple[dict[str, Any], list[str]]:
    """Run the worker; (the child's notes, the parent's other output lines)."""
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), backend.name, db, str(pids), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints the stacks
        out, err = proc.communicate()
        pytest.fail(f"the worker did not end:\n{out}\n{err}")
    assert proc.returncode == 0, f"{out}\n{err}"
    lines = out.splitlines()
    (child,) = [line for line in lines if line.startswith("child ")]
    _, status, text = child.split(" ", 2)
    assert status == "0", f"the child exited with {status}:\n{out}\n{err}"
    assert "parent ok" in lines, f"{out}\n{err}"
    return json.loads(text), lines


def _turns(pids: Path) -> list[tuple[int, str]]:
    rows = [line.split(" ", 1) for line in pids.read_text().splitlines()]
    return [(int(pid), content) for pid, content in rows]


def test_every_call_of_an_inherited_runtime_refuses(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """R-ERR-1 (a distinct, documented code): the child of a fork cannot act for
    its parent, and its exit closes nothing of the parent's."""
    pids = tmp_path / "pids"
    notes, lines = _run(backend, db, pids, "calls")
    refused = {name: code for name, code in notes.items() if name not in CLOSES}
    assert refused == dict.fromkeys(refused, "WRONG_PROCESS"), notes
    assert {name: notes[name] for name in CLOSES} == dict.fromkeys(CLOSES, "ok"), notes
    turns = _turns(pids)
    assert [content for _, content in turns] == ["before", "after"]
    assert len({pid for pid, _ in turns}) == 1  # the parent's, both
    if db.startswith("postgresql://"):
        (connections,) = [line for line in lines if line.startswith("connections ")]
        _, before, after = connections.split()
        assert before == after, connections  # no connection of the parent's ended


def test_what_the_parent_accepted_runs_once_in_the_parent(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """R-FUP-1: accepted before the fork and not yet run, each message runs once,
    in the parent; the child's copy stays inert while its hub runs."""
    pids = tmp_path / "pids"
    notes, _ = _run(backend, db, pids, "pending")
    assert notes == {"logged": []}
    turns = _turns(pids)
    expected = ["before", *(f"queued {i}" for i in range(5)), "after"]
    assert [content for _, content in turns] == expected
    assert len({pid for pid, _ in turns}) == 1


@pytest.mark.parametrize("fork", ["", "-os"], ids=["fork", "plain-os-fork"])
def test_a_runtime_of_the_child_works_beside_the_parent(
    backend: Backend, db: str, tmp_path: Path, fork: str
) -> None:
    """A worker per process, each with a runtime of its own on one store; one
    process runs a session (the parent's lease holds). ``plain-os-fork``: forked
    with a plain ``os.fork()`` on gevent too (multiprocessing's fork start
    method), whose child's hub and threadpool were dead copies: its own gevent
    runtime hung for ever as it opened its store."""
    pids = tmp_path / "pids"
    notes, _ = _run(backend, db, pids, "fresh" + fork)
    assert notes["idle"] is True and notes["resume"] == "LEASE_HELD", notes
    turns = _turns(pids)
    assert sorted(content for _, content in turns) == ["after", "before", "own"]
    parent = {pid for pid, content in turns if content != "own"}
    child = {pid for pid, content in turns if content == "own"}
    assert len(parent) == 1 and len(child) == 1 and parent != child


def test_forks_amid_writes_and_reads(backend: Backend, db: str, tmp_path: Path) -> None:
    """Eight forks while two threads write and read the store: each child's own
    runtime works (no statement of the parent's was in flight in the copy it
    inherited, which would hold SQLite's locks in the child for ever)."""
    pids = tmp_path / "pids"
    proc = subprocess.run(
        [sys.executable, str(WORKER), backend.name, db, str(pids), "busy"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    (forks,) = [line for line in proc.stdout.splitlines() if line.startswith("forks ")]
    assert forks == "forks [0, 0, 0, 0, 0, 0, 0, 0]", f"{proc.stdout}\n{proc.stderr}"
    assert sum(content == "own" for _, content in _turns(pids)) == 8


_TWO_FORKERS = """
import os, sys, threading, time
sys.setswitchinterval(1e-6)  # widen the window between the fork hooks
from subagents.protocol import new_session_id
from subagents.store import SqliteStore

store = SqliteStore(sys.argv[1])
done = []

def forker():
    for _ in range(40):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    done.append(1)

threads = [threading.Thread(target=forker, daemon=True) for _ in range(2)]
for t in threads:
    t.start()
deadline = time.monotonic() + 25
for t in threads:
    t.join(max(0, deadline - time.monotonic()))
reader = threading.Thread(target=lambda: store.header(new_session_id()), daemon=True)
reader.start()
reader.join(5)
print("forks", len(done), "reader", "stuck" if reader.is_alive() else "done", flush=True)
os._exit(0)
"""


def test_two_threads_forking_at_once(tmp_path: Path) -> None:
    """Two threads fork at once (a pool, ``subprocess`` with ``preexec_fn``): one
    fork at a time quiesces the stores -- each used to pause the store again and
    resume what the other paused, and forks or the parent's reads hung on the
    store's locks."""
    proc = subprocess.run(
        [sys.executable, "-c", _TWO_FORKERS, str(tmp_path / "s.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.strip() == "forks 2 reader done", f"{proc.stdout}\n{proc.stderr}"


def test_a_fork_before_the_runtime_ran_leaves_the_copy_inert(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """Forked right after the runtime was made (gunicorn ``--preload``: the master
    never runs a hub), the copy's loops start in the child -- and still never run
    there: nothing logged while the child's hub runs (they started in the child's
    generation, renewed the parent's leases and swept), and a ring to the parent's
    doorbell stays on its socket for the parent (the copy read it)."""
    notes, lines = _run(backend, db, tmp_path / "pids", "preload")
    assert notes == {"logged": []}
    if backend.name == "gevent":  # (on threads the parent's own mail thread reads it)
        assert "ring kept" in lines
    assert [content for _, content in _turns(tmp_path / "pids")] == ["after"]
