"""A script of ``test_sigwake.py``: where a Ctrl-C caught by another thread lands.

Usage: ``python sigwake_worker.py BACKEND MODE``. In each mode the main thread
waits 60 s on an event of an open runtime's backend (on gevent: parked in its hub)
while a thread of the script's own, once the kernel says the main thread sleeps
(``hub_sleep.wait_parked``), sends SIGINT to itself; the script prints
``raised after SECONDS`` when the wait raised ``KeyboardInterrupt``. MODE is

* ``foreign``: just that, with one runtime;
* ``two``: two runtimes made, the first one closed before the wait;
* ``chain``: the script set a wakeup fd of its own before making the runtime: it
  prints ``chained`` if the signal's byte reached it, and ``restored`` if the
  runtime's close put it back;
* ``fork``: a runtime is made, then the process forks; the child prints
  ``child wakeup fd N`` (the wakeup fd it inherited, as it sees it) and does the
  ``foreign`` wait with a runtime of its own (its lines prefixed ``child``); then
  the parent does it with the first runtime;
* ``thread``: a runtime made and closed in another thread: prints ``wakeup fd N``
  (the main thread's, unchanged: -1);
* ``idle`` (and a third argument, a SQLite file): no signal; an agent ran one turn
  and the runtime made its first sweep, and then the script prints ``iterations
  N``: how many times the gevent hub's loop went round while the main thread
  slept 3 s with the runtime open.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

from hub_sleep import wait_parked
from subagents.actors import Runtime


def say(line: str) -> None:
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


def interrupted_wait(rt: Runtime, prefix: str = "") -> None:
    """Wait 60 s on ``rt``'s backend while a thread of ours sends SIGINT to itself."""
    main = threading.get_native_id()
    sent: list[float] = []

    def foreign() -> None:
        wait_parked(os.getpid(), main, rt.backend.name)
        sent.append(time.monotonic())
        # Thread-directed: the C handler runs here, not in the main thread.
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    try:  # from here on: the signal may land before the wait begins (threads)
        threading.Thread(target=foreign, daemon=True).start()
        rt.backend.event().wait(60)
        say(f"{prefix}not interrupted")  # ... or raised late, here
    except KeyboardInterrupt:
        say(f"{prefix}raised after {time.monotonic() - sent[0]:.3f}")


def chain(backend: str) -> None:
    mine, peer = socket.socketpair()
    mine.setblocking(False)
    signal.set_wakeup_fd(mine.fileno())
    rt = Runtime(None, backend=backend)
    interrupted_wait(rt)
    rt.close()
    if peer.recv(16) == bytes([signal.SIGINT]):
        say("chained")
    if signal.set_wakeup_fd(-1) == mine.fileno():
        say("restored")


def forked(backend: str) -> None:
    first = Runtime(None, backend=backend)
    pid = os.fork()
    if pid == 0:
        try:
            inherited = signal.set_wakeup_fd(-1)
            say(f"child wakeup fd {inherited}")
            with Runtime(None, backend=backend) as rt:
                interrupted_wait(rt, "child ")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    interrupted_wait(first)
    first.close()


def in_a_thread(backend: str) -> None:
    def make() -> None:
        Runtime(None, backend=backend).close()

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    say(f"wakeup fd {signal.set_wakeup_fd(-1)}")


def idle(backend: str, db: str) -> None:
    import gevent

    with Runtime(db, backend=backend) as rt:
        agent = rt.spawn("echo")
        agent.followup("hello")
        agent.wait_idle(60)
        assert rt.mail is not None
        while not rt.mail.sweeps:  # the first sweep, a second after the opening
            gevent.sleep(0.05)
        loop = gevent.get_hub().loop
        before = loop.iteration
        gevent.sleep(3.0)
        say(f"iterations {loop.iteration - before}")


def main() -> None:
    backend, mode, *db = sys.argv[1:]
    if mode == "foreign":
        with Runtime(None, backend=backend) as rt:
            interrupted_wait(rt)
    elif mode == "two":
        with Runtime(None, backend=backend) as rt:
            Runtime(None, backend=backend).close()
            interrupted_wait(rt)
    elif mode == "idle":
        idle(backend, *db)
    else:
        {"chain": chain, "fork": forked, "thread": in_a_thread}[mode](backend)


if __name__ == "__main__":
    main()
