"""Where a Ctrl-C lands in a threading runtime: always where the script waits.

The kernel gives a process's SIGINT to any one of its threads that does not
block it, and Python runs the handler only in the main thread, the next time
that thread runs bytecode. A main thread parked in a lock's wait -- ``wait_idle``,
a ``dispose`` -- wakes for a signal only when the signal lands on *it*: when it
lands on an actor's thread, the script went on waiting (up to its timeout)
before it saw its ``KeyboardInterrupt``. So, two rules:

* every thread the runtime starts starts with SIGINT blocked
  (:func:`start_blocking_sigint`), so the signal can only land on the main
  thread -- or on a thread somebody else started (a connection pool's);
* an event the main thread waits on wakes every :data:`POLL` seconds
  (:class:`InterruptibleEvent`), so a signal that landed on such a foreign
  thread is raised that late, not at the end of the wait.
"""

from __future__ import annotations

import importlib
import signal
import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = ["POLL", "InterruptibleEvent", "start_blocking_sigint"]

#: How often the main thread looks for a Ctrl-C another thread caught (seconds).
POLL: Final = 0.2

# The C function behind ``signal.pthread_sigmask``: the public wrapper turns every
# signal of the returned mask into an enum member, which cost a thread start more
# than the two system calls (a one-shot cycle on threads: 11k of 750k instructions).
# (``_signal`` has no type stubs, hence the import by name.)
_sigmask = getattr(importlib.import_module("_signal"), "pthread_sigmask", None)  # POSIX only
_SIGINT: Final = {signal.SIGINT}
_MAIN: Final = threading.main_thread().ident


def start_blocking_sigint(start: Callable[[], None]) -> None:
    """Call ``start`` (it starts a thread) with SIGINT blocked in this thread, so
    the new thread inherits the mask from its first instruction on; restored after.
    A SIGINT arriving meanwhile waits, and is delivered when the mask is restored."""
    if _sigmask is None:
        start()
        return
    old = _sigmask(signal.SIG_BLOCK, _SIGINT)
    try:
        start()
    finally:
        _sigmask(signal.SIG_SETMASK, old)


class InterruptibleEvent(threading.Event):
    """:class:`threading.Event` whose wait, in the main thread, wakes every
    :data:`POLL` seconds (see the module docstring); elsewhere it is the same."""

    def wait(self, timeout: float | None = None) -> bool:
        if (timeout is not None and timeout <= POLL) or threading.get_ident() != _MAIN:
            return super().wait(timeout)
        # Most waits end within the first poll: one plain wait, then the loop, whose
        # deadline counts from the first poll's start (it took POLL, or a hair more).
        if super().wait(POLL):
            return True
        deadline = None if timeout is None else time.monotonic() + timeout - POLL
        while True:
            left = POLL if deadline is None else min(POLL, deadline - time.monotonic())
            # Returning from super().wait runs bytecode: Python's handler runs here.
            if super().wait(max(0.0, left)):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
