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

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hub_sleep import PROMPT, wait_parked
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import MessageEvent, SessionId, TurnEnd
from subagents.store import SqliteStore

WORKER = Path(__file__).with_name("exit_worker.py")


def _start(backend: Backend, db: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-W", "always::ResourceWarning", str(WORKER), backend.name, str(db), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )


def _finish(
    proc: subprocess.Popen[str], timeout: float, stdin: str | None = None
) -> tuple[str, str]:
    """(stdout, stderr) once the worker ended; a worker still running after
    ``timeout`` is aborted and the test fails with every thread's stack."""
    try:
        return proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints the stacks
        out, err = proc.communicate()
        pytest.fail(f"the worker did not end within {timeout} s:\n{out}\n{err}")


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
    out, err = _finish(proc, 60)
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
@pytest.mark.parametrize("mode", ["with-sigint", "bare-sigint", "foreign-sigint"])
def test_ctrl_c_cancels_the_turn_keeps_the_messages_and_raises(
    backend: Backend, tmp_path: Path, mode: str
) -> None:
    """Issue 13 point 6: SIGINT while the script waits for the runtime -- also when
    it lands on a thread of somebody else's (``foreign-sigint``): the main thread,
    parked in ``wait_idle``, must still raise it now (within :data:`PROMPT`), not
    when its wait ends -- nor, on gevent, when its hub next wakes (sent once the
    hub sleeps for long: the signal's own wake-up is all there is)."""
    db = tmp_path / "interrupted.db"
    proc = _start(backend, db, mode)
    assert proc.stdout is not None
    try:
        sid = SessionId(proc.stdout.readline().strip())
        lines = {proc.stdout.readline().strip() for _ in range(2)}
        assert lines == {"turn started", "waiting"}
        if mode == "foreign-sigint":
            wait_parked(proc.pid, proc.pid, backend.name)  # else it may wake by luck
            out, err = _finish(proc, 30, "go\n")  # its wait_idle would last 60 s
            raised = [line for line in out.splitlines() if line.startswith("raised after")]
            assert raised and float(raised[0].split()[-1]) < PROMPT, (out, err)
        else:
            proc.send_signal(signal.SIGINT)
            out, err = _finish(proc, 30)
    finally:
        if proc.poll() is None:  # failed before it ended: never leave it running
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGINT, (out, err)
    assert "\nKeyboardInterrupt\n" in err, err
    assert "finished normally" not in out
    assert ("was never closed" in err) == mode.startswith("bare"), err
    messages, pending, ends, holder = _state(db, sid)
    assert ends == ["cancelled"]
    assert messages == ["work"]
    assert pending == ["work", "queued"]  # the cancelled turn's message runs again
    assert holder is None


@pytest.mark.slow
def test_a_close_interrupted_part_way_is_finished_at_exit(backend: Backend, tmp_path: Path) -> None:
    """Ctrl-C inside ``close()`` (a turn deaf to its cancel holds it): the script
    catches the ``KeyboardInterrupt`` and ends; the close is finished at exit --
    no actor or writer thread is left to hang the interpreter (on threads it hung
    for ever), the lease is released, nothing accepted is lost."""
    db = tmp_path / "close.db"
    proc = _start(backend, db, "close-sigint")
    assert proc.stdout is not None
    try:
        sid = SessionId(proc.stdout.readline().strip())
        assert proc.stdout.readline().strip() == "closing"
        proc.send_signal(signal.SIGINT)
        out, err = _finish(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (out, err)
    assert ("interrupted in close" in out) or ("closed" in out), out
    messages, pending, ends, holder = _state(db, sid)
    assert holder is None
    assert messages == ["work"] and len(ends) == 1
    assert pending == ([] if ends == ["completed"] else ["work"])


def _blocks_sigint(native_id: int) -> bool:
    """Whether the thread blocks SIGINT, from its ``SigBlk`` mask in /proc."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:"))
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.backend_specific
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_the_threading_runtime_leaves_ctrl_c_to_the_main_thread(tmp_path: Path) -> None:
    """Issue 13 point 6: every thread the threading runtime starts -- actors, the
    writer, the lease renewal, the mail pickup -- blocks SIGINT, so the kernel
    hands a Ctrl-C to the main thread, which wakes from the wait it is parked in.
    (When it landed on an actor's thread, ``wait_idle`` waited out its timeout.)"""
    import threading

    from subagents.actors._kernel import THREADING

    before = set(threading.enumerate())  # objects: a thread ended since may lend its ident
    started = THREADING.event()
    release = THREADING.event()

    def parked(turn: object) -> str:
        started.set()
        release.wait(30)
        return "done"

    with Runtime(str(tmp_path / "threads.db"), backend="threading") as rt:
        agent = rt.spawn(parked)
        agent.followup("hold the actor's thread")
        try:
            assert started.wait(30)
            ours = [t for t in threading.enumerate() if t not in before]
            names = [t.name for t in ours]
            assert any(n.startswith("subagents-") for n in names), names  # tasks
            assert any(n.startswith("_AgentActor[") for n in names), names  # the agent's actor
            assert all(t.native_id is not None and _blocks_sigint(t.native_id) for t in ours), [
                t.name for t in ours if t.native_id is None or not _blocks_sigint(t.native_id)
            ]
            assert not _blocks_sigint(threading.main_thread().native_id or 0)
        finally:
            release.set()
        assert rt.wait_idle(30)
