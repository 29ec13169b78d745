"""A script of ``test_fork.py``: a runtime made before ``fork()``, and the child.

Usage: ``python fork_worker.py BACKEND DB PIDS MODE``. The parent makes a
runtime on ``DB``, spawns an agent that appends ``"<pid> <content>"`` to the
file ``PIDS`` at each turn, runs one turn (``before``), and forks -- with
``gevent.fork()`` on gevent (what a gevent server's workers do), ``os.fork()``
on threads. MODE says what the child does:

* ``calls``: calls every public operation of the inherited runtime, its agent,
  its session service and its store, noting each one's error code (``ok`` if it
  returned), lets go of the copy (collected), then exits the usual way
  (``sys.exit``: exit handlers run);
* ``pending``: the parent accepts five follow-ups and forks before its actors
  ran them; the child lets its hub run for a while (long enough for several
  lease renewals and wake-ups of the inherited copy), noting every log record of
  ``subagents`` at warning level or above, then exits;
* ``fresh``: the child makes a runtime of its own on ``DB``, runs an agent of its
  own, tries to resume the parent's session (``LEASE_HELD``: the parent holds
  it), closes its runtime and exits;
* ``preload``: the parent forks right after making its runtime, before its hub
  (on gevent) ever ran the runtime's loops -- gunicorn ``--preload`` -- and the
  child lets its hub run as ``pending`` does; then a ring to the parent's
  doorbell, rung while the child's hub runs, must still be waiting on the
  parent's socket on gevent, whose hub the parent blocks meanwhile (the child's
  copy of the mail task must not read it); the parent prints ``ring kept`` or
  ``ring lost``;
* ``busy``: while two threads of the parent follow up and read its session in a
  loop (writes and reads in flight), the parent forks eight times in a row; each
  child does what ``fresh`` does. The parent prints ``forks`` and each child's
  exit status (a child stuck on a lock the copy left held is killed after 30 s).

A MODE ending in ``-os`` forks with a plain ``os.fork()`` on gevent too (no
monkey-patching: multiprocessing's fork start method, a server's own fork).

The child writes its notes as JSON to a pipe; the parent prints them as the line
``child {...}`` with the child's exit status, then accepts ``after``, waits for
it, prints ``parent ok`` and closes. On PostgreSQL the parent also prints
``connections N M``: how many of the parent's long-lived connections (its
writer's, its listener's) the server runs before the fork and after the child's
exit (a child that closed an inherited connection would have ended the
parent's). Every wait is bounded.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import logging
import os
import sys
import time
from typing import Any

from subagents.actors import Runtime, UserAuthority
from subagents.protocol import SubagentError, new_message_id

BOUND = 5.0  # seconds any wait of the child may take


class _Notes(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.levelname} {record.getMessage()}")


def _outcome(call: Any) -> str:
    try:
        call()
    except SubagentError as exc:
        return str(exc.code)
    except BaseException as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _calls(rt: Runtime, agent: Any, record: Any) -> dict[str, str]:
    sid = agent.session_id
    store = rt.store
    calls: list[tuple[str, Any]] = [
        ("followup", lambda: agent.followup("in the child")),
        ("followup_by_id", lambda: agent.followup("again", message_id=new_message_id())),
        ("steer", lambda: agent.followup("steered", steer=True)),
        ("wait_idle", lambda: agent.wait_idle(BOUND)),
        ("cancel", lambda: agent.cancel()),
        ("statistics", lambda: agent.statistics()),
        ("wait_disposed", lambda: agent.wait_disposed(BOUND)),
        ("dispose", lambda: agent.dispose(timeout=BOUND)),
        ("spawn", lambda: rt.spawn(record)),
        ("resume", lambda: rt.agents.resume(sid, behaviour=record)),
        ("send", lambda: rt.agents.send(sid, "sent in the child")),
        ("read", lambda: rt.sessions.read(sid)),
        ("flush", lambda: rt.sessions.flush(timeout=BOUND)),
        ("runtime_wait_idle", lambda: rt.wait_idle(BOUND)),
        ("runtime_statistics", lambda: rt.statistics()),
        ("list_children", lambda: rt.subagents.list_children(sid)),
        ("interrupt", lambda: rt.subagents.interrupt(sid, UserAuthority(sid))),
        ("report_from", lambda: rt.subagents.report_from(agent, "report")),
        ("report_receipt", lambda: rt.subagents.report_receipt(sid, new_message_id())),
        ("child_statistics", lambda: rt.subagents.statistics(sid)),
        ("hold_residency", lambda: rt.subagents.hold_residency(agent)),
        ("store_read", lambda: store.read(sid)),
        ("store_header", lambda: store.header(sid)),
        ("store_flush", lambda: store.flush()),
        ("close", lambda: rt.close()),
        ("close_again", lambda: rt.close()),
        ("store_close", lambda: store.close()),
    ]
    return {name: _outcome(call) for name, call in calls}


def _pending(rt: Runtime) -> dict[str, Any]:
    notes = _Notes()
    logging.getLogger("subagents").addHandler(notes)
    until = time.monotonic() + 1.0  # three renewals of a 0.6 s lease, and more
    while time.monotonic() < until:
        rt.backend.sleep(0.05)  # on gevent: the hub runs whatever the copy scheduled
    return {"logged": notes.records}


def _fresh(backend: str, db: str, sid: Any, record: Any) -> dict[str, Any]:
    with Runtime(db, backend=backend) as own:
        agent = own.spawn(record, label="child's own")
        agent.followup("own")
        idle = agent.wait_idle(BOUND)
        resumed = _outcome(lambda: own.agents.resume(sid, behaviour=record))
        return {"own": str(agent.session_id), "idle": idle, "resume": resumed}


def _preload(rt: Runtime, fork: Any) -> None:
    import socket

    from subagents.actors._kernel._doorbell import ring

    assert rt.mail is not None
    bell = rt.mail.doorbell
    read_end, write_end = os.pipe()
    pid = fork()
    if pid == 0:
        os.close(read_end)
        faulthandler.dump_traceback_later(30, exit=True)
        notes = _pending(rt)
        with os.fdopen(write_end, "w") as out:
            out.write(json.dumps(notes))
        os._exit(0)
    os.close(write_end)
    # The parent's hub does not run meanwhile: only the child could read its socket.
    ring(bell.local_address, b"I" + b"x" * 40)
    with os.fdopen(read_end) as inp:
        text = inp.read()
    _, status = os.waitpid(pid, 0)
    print(f"child {os.waitstatus_to_exitcode(status)} {text}", flush=True)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM, fileno=os.dup(bell._sock.fileno()))
    try:
        raw.recv(1024, socket.MSG_DONTWAIT)
        print("ring kept", flush=True)
    except BlockingIOError:
        print("ring lost", flush=True)
    finally:
        raw.close()


def _busy(rt: Runtime, agent: Any, backend: str, db: str, record: Any, fork: Any) -> None:
    import threading

    stop = threading.Event()

    def hammer(n: int) -> None:
        i = 0
        while not stop.is_set():
            agent.followup(f"busy {n} {i}")
            rt.store.read(agent.session_id)  # type: ignore[union-attr]
            i += 1

    hammers = [threading.Thread(target=hammer, args=(n,)) for n in range(2)]
    for t in hammers:
        t.start()
    statuses = []
    for _ in range(8):
        pid = fork()
        if pid == 0:
            faulthandler.dump_traceback_later(30, exit=True)
            code = 2
            try:
                notes = _fresh(backend, db, agent.session_id, record)
                code = 0 if notes["idle"] and notes["resume"] == "LEASE_HELD" else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        statuses.append(os.waitstatus_to_exitcode(status))
    stop.set()
    for t in hammers:
        t.join()
    print(f"forks {statuses}", flush=True)
    assert agent.wait_idle(BOUND * 4)
    rt.close()


def _backends(rt: Runtime) -> list[int]:
    """The server processes of the parent's long-lived connections: its writer's
    and its listener's (the test's other workers share the server)."""
    store: Any = rt.store
    mail: Any = rt.mail
    conns = [store._writer.conn.raw, getattr(mail, "_listener", None)]
    pids = [int(conns[0].info.backend_pid)]
    if conns[1] is not None and conns[1]._conn is not None:
        pids.append(int(conns[1]._conn.info.backend_pid))
    return pids


def _connections(db: str, backends: list[int]) -> int:
    """How many of ``backends`` the server still runs."""
    import psycopg

    with psycopg.connect(db.split("?")[0], autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (backends,)
        ).fetchone()
    return int(row[0]) if row else -1


def main() -> None:
    backend, db, pids, mode = sys.argv[1:5]
    plain, mode = mode.endswith("-os"), mode.removesuffix("-os")
    if backend == "gevent" and not plain:
        import gevent

        fork = gevent.fork
    else:
        fork = os.fork

    def record(turn: Any) -> str:
        with open(pids, "a") as f:
            f.write(f"{os.getpid()} {turn.content}\n")
        return "noted"

    # A short lease: the child's window sees several renewals of the copy. Not
    # where the parent forks eight times (waiting for each child, on gevent with
    # its hub blocked): its lease must outlast that.
    rt = Runtime(db, backend=backend, lease_ttl=30.0 if mode == "busy" else 0.6)
    if mode == "preload":
        _preload(rt, fork)
        agent = rt.spawn(record, label="parent")
        agent.followup("after")
        assert agent.wait_idle(BOUND)
        print("parent ok", flush=True)
        rt.close()
        return
    agent = rt.spawn(record, label="parent")
    agent.followup("before")
    assert agent.wait_idle(BOUND)
    print(f"session {agent.session_id}", flush=True)
    if mode == "pending":
        for i in range(5):
            agent.followup(f"queued {i}")
    if mode == "busy":
        _busy(rt, agent, backend, db, record, fork)
        return
    postgres = db.startswith("postgresql://")
    backends = _backends(rt) if postgres else []
    before = _connections(db, backends) if postgres else 0
    read_end, write_end = os.pipe()
    pid = fork()
    if pid == 0:
        os.close(read_end)
        faulthandler.dump_traceback_later(30, exit=True)
        if mode == "calls":
            notes: dict[str, Any] = _calls(rt, agent, record)
            rt = agent = None  # type: ignore[assignment]
            gc.collect()  # the copy, let go: nothing of it may end what the parent uses
        elif mode == "pending":
            notes = _pending(rt)
        else:
            notes = _fresh(backend, db, agent.session_id, record)
        with os.fdopen(write_end, "w") as out:
            out.write(json.dumps(notes))
        faulthandler.cancel_dump_traceback_later()
        sys.exit(0)  # the usual way out: exit handlers run in the child
    os.close(write_end)
    with os.fdopen(read_end) as inp:
        text = inp.read()  # blocks the hub on gevent: the parent's actors wait
    _, status = os.waitpid(pid, 0)
    print(f"child {os.waitstatus_to_exitcode(status)} {text}", flush=True)
    if postgres:
        print(f"connections {before} {_connections(db, backends)}", flush=True)
    agent.followup("after")
    assert agent.wait_idle(BOUND * 2)
    print("parent ok", flush=True)
    rt.close()


if __name__ == "__main__":
    main()
