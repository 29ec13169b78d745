"""A worker process of ``test_remote_start.py``: it holds a tree another process reaches.

Usage::

    python start_worker.py DB BACKEND MARKS MODE TTL

Opens a strict runtime (``lease_ttl=TTL``) and spawns a root (model ``echo``).
``MODE`` ``root``: prints the root's id. ``blocked``: also starts a continuable
child of model ``block``, whose turns here never end, and once its first turn
runs prints ``ROOT CHILD`` -- the test then kills this process, holding both.
The ``pid`` model writes this process's pid and its session's id to MARKS when
its turn runs: a child the other process starts by the root's id runs here.
Waits for its stdin to close. With ``SUBAGENTS_TEST_HOST`` set, its lease holder
names that host instead of this one (a worker on another machine: nothing here
can judge it by its pid).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from subagents.actors import ContinuableStartSpec, Runtime


def main(db: str, backend: str, marks: str, mode: str, ttl: str) -> int:
    if os.environ.get("SUBAGENTS_TEST_HOST"):
        from subagents.store import _holders

        _holders._HOST = os.environ["SUBAGENTS_TEST_HOST"]
    with Runtime(db, backend=backend, lease_ttl=float(ttl)) as rt:

        def pid(_options: Any) -> Any:
            def on_turn(turn: Any) -> None:
                tmp = marks + ".tmp"
                with open(tmp, "w") as f:
                    f.write(f"{os.getpid()} {turn.agent.session_id}\n")
                os.replace(tmp, marks)  # whole, or not there

            return on_turn

        running = rt.backend.event()

        def block(_options: Any) -> Any:
            def on_turn(turn: Any) -> None:
                running.set()
                turn.signal.wait(3600)

            return on_turn

        rt.models.register("pid", pid)
        rt.models.register("block", block)
        root = rt.spawn("echo", label="root")
        if mode == "blocked":
            child, _mid = rt.subagents.start_continuable(
                ContinuableStartSpec(parent=root, provider="local", prompt="first", label="c",
                                     model="block")
            )  # fmt: skip
            assert running.wait(30)
            print(root.session_id, child, flush=True)
        else:
            print(root.session_id, flush=True)
        if backend == "gevent":  # the hub must run while this waits for stdin
            import gevent.os

            while gevent.os.tp_read(sys.stdin.fileno(), 1):
                pass
        else:
            sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
