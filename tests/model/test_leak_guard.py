"""The leak guard (``tests/resource_guard.py``, on in the model, example-server and
CLI tests) fails the test that leaked a socket -- at its teardown, naming it -- and
not a later test whose allocations happened to collect the socket and so raised its
``ResourceWarning`` as an error. Three sockets leaked by an earlier test once failed
an innocent test this way. Test infrastructure: no R-* requirement."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_leaked_socket_fails_the_test_that_leaked_it() -> None:
    probe = Path(__file__).with_name("leak_probe.py").relative_to(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-rA", str(probe)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert f"ERROR {probe}::test_leaks_a_socket_in_a_cycle" in out, out
    assert "unclosed <socket.socket" in out, out
    assert f"PASSED {probe}::test_an_innocent_one_after" in out, out
    assert "2 passed, 1 error" in out, out
