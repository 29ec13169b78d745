"""A worker process of ``test_remote_start.py``: it holds a root, another starts its child.

Usage::

    python start_worker.py DB BACKEND MARKS

Spawns a root (model ``echo``) and prints its id. The ``pid`` model writes this
process's pid and its session's id to MARKS when its turn runs: the child the
other process starts by the root's id runs here. Waits for its stdin to close.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from subagents.actors import Runtime


def main(db: str, backend: str, marks: str) -> int:
    with Runtime(db, backend=backend) as rt:

        def pid(_options: Any) -> Any:
            def on_turn(turn: Any) -> None:
                tmp = marks + ".tmp"
                with open(tmp, "w") as f:
                    f.write(f"{os.getpid()} {turn.agent.session_id}\n")
                os.replace(tmp, marks)  # whole, or not there

            return on_turn

        rt.models.register("pid", pid)
        root = rt.spawn("echo", label="root")
        print(root.session_id, flush=True)
        if backend == "gevent":  # the hub must run while this waits for stdin
            import gevent.os

            while gevent.os.tp_read(sys.stdin.fileno(), 1):
                pass
        else:
            sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3]))
