"""Ctrl-C caught by a thread of somebody else's (issue 13 point 6), in real
subprocesses, on both backends: the main thread, waiting on the runtime -- on
gevent parked in its hub, which nothing else wakes for a minute -- raises the
``KeyboardInterrupt`` within :data:`~hub_sleep.PROMPT`, not when its wait ends;
with several runtimes, a wakeup fd the script set itself (still told of the
signal, and put back at the close), and in the child of a fork. A runtime made
outside the main thread changes nothing, and an idle gevent hub sleeps as long
as it did.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hub_sleep import PROMPT
from subagents.actors._kernel._backend import Backend

WORKER = Path(__file__).with_name("sigwake_worker.py")


def _run(backend: str, mode: str, *args: str) -> list[str]:
    """The worker's stdout lines; it must exit 0 within a generous bound."""
    proc = subprocess.run(
        [sys.executable, str(WORKER), backend, mode, *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return proc.stdout.splitlines()


def _raised_promptly(lines: list[str], prefix: str = "") -> None:
    raised = [line for line in lines if line.startswith(f"{prefix}raised after")]
    assert len(raised) == 1, lines
    assert float(raised[0].split()[-1]) < PROMPT, lines


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["foreign", "two"])
def test_ctrl_c_on_a_foreign_thread_raises_at_once(backend: Backend, mode: str) -> None:
    """With one runtime open, or two made and the first closed (the second still
    needs the wake-up the first one's close must not take away)."""
    _raised_promptly(_run(backend.name, mode))


@pytest.mark.slow
def test_a_wakeup_fd_of_the_scripts_own_is_told_and_put_back(backend: Backend) -> None:
    """A wakeup fd set before the runtime (asyncio's, a program's own) still gets
    the signal's byte, and is the wakeup fd again once the runtime closed."""
    lines = _run(backend.name, "chain")
    _raised_promptly(lines)
    assert "chained" in lines and "restored" in lines, lines


@pytest.mark.slow
def test_the_child_of_a_fork_wakes_for_its_own_signals_only(backend: Backend) -> None:
    """The child inherits no wakeup fd of the parent's runtime (its signals would
    wake the parent, and its hub would read the parent's); a runtime of its own
    wakes it, and the parent's still wakes the parent."""
    lines = _run(backend.name, "fork")
    assert "child wakeup fd -1" in lines, lines
    _raised_promptly(lines, "child ")
    _raised_promptly(lines)


def test_a_runtime_outside_the_main_thread_leaves_the_wakeup_fd_alone(backend: Backend) -> None:
    """Only the main thread may set it, and only the main thread's waits need it."""
    assert _run(backend.name, "thread") == ["wakeup fd -1"]


@pytest.mark.backend_specific
def test_an_idle_gevent_runtime_does_not_wake_its_hub(tmp_path: Path) -> None:
    """No polling for signals: while the main thread sleeps 3 s with an idle
    durable runtime open, the hub's loop goes round for the sleep's own timer (2:
    arming it, its expiry) -- at most one more for a stray store write's completion
    or a lease renewal, never once per poll."""
    lines = _run("gevent", "idle", str(tmp_path / "idle.db"))
    assert len(lines) == 1 and lines[0].startswith("iterations"), lines
    assert int(lines[0].split()[1]) <= 3, lines
