"""A script of ``test_exit.py``: a runtime in the states a user's script leaves it.

Usage: ``python exit_worker.py BACKEND DB MODE`` where MODE is

* ``forget``: spawn an agent, queue five follow-ups, return without ``close()``;
* ``with-sigint`` / ``bare-sigint``: a turn blocks (cooperatively, on its
  signal) and a second message waits behind it; the script waits for the
  runtime to be idle -- in a ``with Runtime(...)`` block or without one -- and
  prints ``waiting`` first: the test sends SIGINT then;
* ``foreign-sigint``: as ``with-sigint``, but the SIGINT is raised in a thread
  the script started (as a library's pool would): the test writes a line to
  the worker's stdin, and that thread signals itself; the script prints how long
  after the signal its wait raised (``raised after SECONDS``);
* ``close-sigint``: a turn that ignores its cancel for 3 s runs when the script
  closes the runtime; the turn prints ``closing`` when the close has cancelled it
  (the test sends SIGINT then, inside the close); the script catches the
  ``KeyboardInterrupt`` and returns, leaving the close unfinished.

Each prints the session id first.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from subagents.actors import Runtime


def say(line: str) -> None:
    """One line in one write: ``print`` writes the text and its newline apart, and
    two threads' lines would interleave ("waitingturn started")."""
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


def slow(turn: Any) -> Any:
    say("turn started")
    turn.signal.wait(60)
    return "cancelled" if turn.cancelled else "done"


def close_interrupted(rt: Runtime) -> None:
    started = rt.backend.event()

    def stubborn(turn: Any) -> Any:
        started.set()
        told = False
        end = time.monotonic() + 3.0
        while time.monotonic() < end:  # deaf to its cancel ...
            if turn.cancelled and not told:  # ... which close() sent: it is inside
                say("closing")
                told = True
            turn.agent.host.backend.sleep(0.01)
        return "done"

    rt.models.register("stubborn", lambda _o: stubborn)
    agent = rt.spawn("stubborn")
    say(agent.session_id)
    agent.followup("work")
    started.wait(30)
    try:
        rt.close()
        say("closed")
    except KeyboardInterrupt:
        say("interrupted in close")


def run(rt: Runtime, mode: str) -> None:
    if mode == "close-sigint":
        close_interrupted(rt)
        return
    if mode == "forget":
        agent = rt.spawn("echo")
        say(agent.session_id)
        for i in range(5):
            agent.followup(f"m{i}")
        return
    rt.models.register("slow", lambda _o: slow)
    agent = rt.spawn("slow")
    say(agent.session_id)
    agent.followup("work")
    agent.followup("queued")
    try:  # the signal may land as the wait begins (after the line is out)
        say("waiting")
        rt.wait_idle(60)
    except KeyboardInterrupt:
        if _signalled:
            say(f"raised after {time.monotonic() - _signalled[0]:.3f}")
        raise
    say("finished normally")


_signalled: list[float] = []  # when the foreign thread sent its SIGINT


def _signal_from_a_foreign_thread() -> None:
    sys.stdin.readline()
    _signalled.append(time.monotonic())
    # Thread-directed: the C handler runs here, not in the main thread.
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)


def main() -> None:
    backend, db, mode = sys.argv[1:]
    if mode == "foreign-sigint":
        threading.Thread(target=_signal_from_a_foreign_thread, daemon=True).start()
    if mode.startswith(("with", "foreign")):
        with Runtime(db, backend=backend) as rt:
            run(rt, mode)
    else:
        run(Runtime(db, backend=backend), mode)


if __name__ == "__main__":
    main()
