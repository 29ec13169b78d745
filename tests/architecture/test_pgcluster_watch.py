"""The throwaway PostgreSQL clusters of the tests (``tests/pgcluster.py``) do not
outlive a test worker that is killed: a worker ended by SIGKILL, or by ``os._exit``
on a timeout, runs no cleanup, and its server would keep running (and keep its
directory) until someone stopped it by hand."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]

OWNER = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import pgcluster

cluster = pgcluster.start(owner_pid=os.getpid())
print(cluster.base, cluster.port, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_cluster_whose_owner_is_killed_is_destroyed() -> None:
    """The owner starts a watched cluster, which accepts connections, and SIGKILLs
    itself; the watcher stops the server and removes its directory."""
    sys.path.insert(0, str(TESTS))
    import pgcluster

    if pgcluster.bindir() is None:
        if os.environ.get("SUBAGENTS_REQUIRE_POSTGRES"):
            pytest.fail("no PostgreSQL server binaries")
        pytest.skip("no PostgreSQL server binaries")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OWNER.format(tests=str(TESTS)))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr
    base_text, port_text = proc.stdout.split()
    base, port = Path(base_text), int(port_text)
    # Waiting on another process's cleanup, not ordering our own threads.
    deadline = time.monotonic() + 60
    while base.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not base.exists(), f"{base} is still there a minute after its owner died"
    assert not _accepts(port), f"a server still listens on {port}"
