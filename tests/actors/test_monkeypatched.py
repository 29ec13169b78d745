"""Re-run part of the suite in a subprocess that monkey-patches before any import.

This is how the single ``pytest`` command also covers gevent servers that patch
the stdlib: ``from gevent import monkey; monkey.patch_all()`` has to run before
pykka or ``subagents`` are imported (pykka creates its registry lock at import
time), so it cannot happen inside this process. The child runs ``pytest.main`` on
:data:`PATCHED_SUITE`, with the same configuration (``filterwarnings=error``,
timeouts, the leak guard), and this test asserts that it passed.

Add a test file to :data:`PATCHED_SUITE` when its code must also hold under
patching (the threading backend's primitives are then cooperative, and
``current_backend()`` answers THREADING everywhere).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gevent.monkey
import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Test files (relative to the repository root) that also run monkey-patched.
PATCHED_SUITE: list[str] = [
    "tests/actors/test_backend.py",
    "tests/actors/test_gevent_runtime.py",
    "tests/actors/test_signal.py",
    "tests/runtime/test_agent.py",
    "tests/runtime/test_oneshot.py",
    "tests/runtime/test_events.py",
    "tests/catalog",
]

CHILD = """
from gevent import monkey
monkey.patch_all()

import sys
import pytest

print("threading patched:", monkey.is_module_patched("threading"), flush=True)
code = int(pytest.main(sys.argv[1:]))
sys.stdout.flush()
sys.stderr.flush()
# Skip interpreter finalization: the verdict is in, and tearing down a patched
# process's leftover greenlets at exit has crashed CPython once in CI after every
# test had passed (greenlet objects freed from a thread that no longer exists).
import os
os._exit(code)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(gevent.monkey.is_module_patched("threading"), reason="already the patched pass")
def test_suite_passes_monkey_patched() -> None:
    env = dict(os.environ, SUBAGENTS_MONKEYPATCHED_RUN="1", PYTHONFAULTHANDLER="1")
    # "-n 0": in this process, which gevent patched, not in test workers of their own.
    args = ["-q", "-p", "no:cacheprovider", "-n", "0", "-x", *PATCHED_SUITE]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    output = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, output
    assert " passed" in proc.stdout, output
    assert "threading patched: True" in proc.stdout, output
