"""A producer process the crash tests kill with SIGKILL at a chosen point.

Usage: ``python crash_worker.py DB BACKEND RUNS KIND K [BURSTS SIZE]``

It opens a strict runtime on the store ``DB`` (an SQLite file or a PostgreSQL
URL), spawns a root agent, starts one continuable child of model ``rec`` and
follows it up in ``BURSTS`` bursts of ``SIZE`` messages, waiting for the child
to settle between bursts (so a burst's first message cold-resumes it and the
rest queue behind), then waits until the child ran them all (except for
``close``) and closes the runtime. Every id a call returned is printed (``id
<message id>``) and flushed before the next call.

``rec`` appends ``<pid> <message id> <redelivered>`` to the file ``RUNS`` (an
O_APPEND write: it survives the kill) each time it runs a turn.

The process sends itself SIGKILL at the ``K``-th occurrence of ``KIND``:

* ``accept-in`` -- inside an acceptance's transaction (nothing of it commits);
* ``accept-out`` -- after an acceptance committed, before the call returns;
* ``turn-in`` -- as a turn's behaviour starts, ``turn-mid`` -- after it ran;
* ``end-in`` / ``end-out`` -- inside / right after the transaction of a ``turn/end``;
* ``checkpoint`` / ``release`` -- inside a settle's checkpoint / lease release;
* ``handover`` -- inside a resume's or a routed message's hand-over;
* ``never`` -- run to the end (every follow-up ran) and exit 0;
* ``close`` -- close the runtime right after the last follow-up returned, with
  work still queued or running, and exit 0.

The hooks wrap private functions: this is a test harness for those internals.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from subagents.actors import AbortController, ContinuableStartSpec, Runtime
from subagents.actors._agents._sessions import SessionService
from subagents.actors.testing import LifecycleProbe
from subagents.store import _pg_txn, _writer

DB, BACKEND, RUNS, KIND, K = sys.argv[1:6]
BURSTS = int(sys.argv[6]) if len(sys.argv) > 6 else 4
SIZE = int(sys.argv[7]) if len(sys.argv) > 7 else 3
AT = int(K)

_counts: dict[str, int] = {}
_lock = threading.Lock()
_end_committing = threading.local()


def hit(kind: str) -> None:
    """Count one occurrence of ``kind``; die on the chosen one."""
    with _lock:
        n = _counts[kind] = _counts.get(kind, 0) + 1
    if kind == KIND and n == AT:
        os.kill(os.getpid(), signal.SIGKILL)


def _wrap_txn(name: str, kind: str, when: Any = None) -> None:
    original = getattr(_writer.Txn, name)

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if when is None or when(*args, **kwargs):
            hit(kind)
        return original(self, *args, **kwargs)

    setattr(_writer.Txn, name, wrapped)


def _ends_a_turn(session_id: Any, bodies: Any, token: Any = None, done: Any = ()) -> bool:
    if done:
        _end_committing.value = True
        return True
    return False


_wrap_txn("accept_messages", "accept-in", lambda sid, messages, epoch, at, *rest: at != 0.0)
_wrap_txn("append", "end-in", _ends_a_turn)
_wrap_txn("put_checkpoint", "checkpoint")
_wrap_txn("release", "release")
_wrap_txn("hand_over", "handover", lambda sid, ids, epoch, token: epoch is not None)

_transaction = _writer.Writer._transaction


def _transaction_then(self: Any, batch: Any) -> None:
    _end_committing.value = False
    _transaction(self, batch)
    if _end_committing.value:
        hit("end-out")


_writer.Writer._transaction = _transaction_then  # type: ignore[method-assign]

_pg_transaction = _pg_txn.PgWriter._transaction


def _pg_transaction_then(self: Any, batch: Any) -> None:
    _end_committing.value = False
    _pg_transaction(self, batch)
    if _end_committing.value:
        hit("end-out")


_pg_txn.PgWriter._transaction = _pg_transaction_then  # type: ignore[method-assign]

_accept = SessionService.accept


def _accept_then(self: Any, *args: Any, **kwargs: Any) -> Any:
    result = _accept(self, *args, **kwargs)
    hit("accept-out")
    return result


SessionService.accept = _accept_then  # type: ignore[method-assign]

_runs = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
_ran: set[str] = set()
_ran_changed = AbortController()


def rec(options: Any) -> Any:
    def on_turn(turn: Any) -> Any:
        global _ran_changed
        hit("turn-in")
        mid = turn.messages[-1].message_id
        os.write(_runs, f"{os.getpid()} {mid} {int(turn.redelivered)}\n".encode())
        hit("turn-mid")
        with _lock:
            _ran.add(str(mid))
            changed, _ran_changed = _ran_changed, AbortController()
        changed.abort("ran")
        return turn.content

    return on_turn


def wait_ran(ids: list[str]) -> None:
    """Wait until this process ran every id in ``ids`` (on either backend)."""
    while True:
        with _lock:
            if _ran.issuperset(ids):
                return
            changed = _ran_changed
        assert changed.signal.wait(60), "a follow-up never ran"


def main() -> None:
    rt = Runtime(DB, backend=BACKEND)
    rt.models.register("rec", rec)
    probe = LifecycleProbe(rt)
    root = rt.spawn("echo", label="root")
    print("root", root.session_id, flush=True)
    handle = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="p", label="kid", model="rec")
    )
    print("kid", handle.child_id, flush=True)
    print("id", handle.message_id, flush=True)
    returned = [str(handle.message_id)]
    for burst in range(BURSTS):
        ends = burst + 1
        assert probe.wait_for(
            lambda evs, ends=ends: sum(e.type == "subagent/end" for e in evs) >= ends, 60
        ), "the child did not settle"
        for i in range(SIZE):
            mid = rt.subagents.followup(root, handle.child_id, f"m{burst}.{i}")
            print("id", mid, flush=True)
            returned.append(str(mid))
    if KIND != "close":  # close: with work still queued, or a turn running
        wait_ran(returned)
    probe.close()
    rt.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
