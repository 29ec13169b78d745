"""Safe exit (issue 13 point 6), each case in a real subprocess, on both backends.

* A script that never closes its runtime exits (no hang on the threading
  backend's non-daemon threads), with a ``ResourceWarning`` naming the runtime;
  everything it accepted is in the store -- run, or pending for the next
  activation -- and the session's lease is released.
* Ctrl-C (SIGINT) while the script waits: the running turn is cancelled (its
  ``turn/end`` says so), what was accepted stays accepted, the lease is
  released, and the process ends the usual way, by ``KeyboardInterrupt``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import MessageEvent, SessionId, TurnEnd
from subagents.store import SqliteStore

WORKER = Path(__file__).with_name("exit_worker.py")


def _start(backend: Backend, db: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-W", "always::ResourceWarning", str(WORKER), backend.name, str(db), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _state(db: Path, sid: SessionId) -> tuple[list[object], list[object], list[str], object]:
    """(contents of the log's messages, pending contents, stop reasons, lease holder)."""
    store = SqliteStore(str(db))
    try:
        events = [r.event for r in store.read(sid)]
        pending = [e.event.content for e in store.pending(sid)]
        lease = store.get_lease(sid)
    finally:
        store.close()
    messages = [e.content for e in events if isinstance(e, MessageEvent)]
    ends = [e.stop_reason for e in events if isinstance(e, TurnEnd)]
    return messages, pending, ends, None if lease is None else lease.holder


@pytest.mark.slow
def test_a_runtime_never_closed_exits_and_keeps_what_it_accepted(
    backend: Backend, tmp_path: Path
) -> None:
    """Issue 13 point 6: no hang, a ResourceWarning, nothing accepted lost."""
    db = tmp_path / "forgot.db"
    proc = _start(backend, db, "forget")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "ResourceWarning" in err and "was never closed" in err, err
    assert "Traceback" not in err, err
    sid = SessionId(out.split()[0])
    messages, pending, ends, holder = _state(db, sid)
    assert holder is None
    sent = [f"m{i}" for i in range(5)]
    # Each follow-up either ran to a completed turn or waits in the inbox.
    ran = messages[: ends.count("completed")]
    assert ran + [p for p in pending if p not in ran] == sent
    assert set(ends) <= {"completed", "cancelled"}
    with Runtime(str(db), backend=backend) as rt:
        agent = rt.agents.resume(sid)  # the rest runs now
        assert agent.wait_idle(10)
    messages, pending, ends, _ = _state(db, sid)
    assert pending == []
    completed = [m for m, e in zip(messages, ends) if e == "completed"]
    assert completed == sent


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["with-sigint", "bare-sigint"])
def test_ctrl_c_cancels_the_turn_keeps_the_messages_and_raises(
    backend: Backend, tmp_path: Path, mode: str
) -> None:
    """Issue 13 point 6: SIGINT while the script waits for the runtime."""
    db = tmp_path / "interrupted.db"
    proc = _start(backend, db, mode)
    assert proc.stdout is not None
    sid = SessionId(proc.stdout.readline().strip())
    lines = {proc.stdout.readline().strip() for _ in range(2)}
    assert lines == {"turn started", "waiting"}
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT, (out, err)
    assert "\nKeyboardInterrupt\n" in err, err
    assert "finished normally" not in out
    assert ("was never closed" in err) == mode.startswith("bare"), err
    messages, pending, ends, holder = _state(db, sid)
    assert ends == ["cancelled"]
    assert messages == ["work"]
    assert pending == ["work", "queued"]  # the cancelled turn's message runs again
    assert holder is None
