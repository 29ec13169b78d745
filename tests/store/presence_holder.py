"""A process that holds a presence on an SQLite file (``test_store_presence.py``,
``tests/cli/test_gone_holder_state.py``).

Usage::

    python presence_holder.py DB [fork|stall]

Opens the store, takes its presence (``listen``) and prints its address; with
``fork``, then forks a child that prints its pid and waits. Both
wait for stdin to close; the test kills this process (the parent). With
``stall``, the making of the presence stops before its lock file is renamed into
place: the process prints the temporary file's path and waits there.
"""

from __future__ import annotations

import os
import sys

from subagents.store import SqliteStore


def main(db: str, mode: str = "") -> int:
    if mode == "stall":
        rename = os.rename

        def stalled(src: str, dst: str) -> None:
            if src.endswith(".tmp"):
                print(src, flush=True)
                sys.stdin.read()  # (killed here)
            rename(src, dst)

        os.rename = stalled  # type: ignore[assignment]
    store = SqliteStore(db)
    presence = store.listen()
    assert presence is not None
    print(presence.address, flush=True)
    if mode == "fork" and os.fork() == 0:  # past the fork's hooks: the child prints
        print(os.getpid(), flush=True)
        sys.stdin.read()
        os._exit(0)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
