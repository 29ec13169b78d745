"""Whether a thread sleeps where a signal caught elsewhere must wake it, from /proc.

A Ctrl-C caught by a thread other than the main one only marks the signal pending;
the main thread raises it at its next bytecode. A test of that must send the
signal while the main thread sleeps -- in its gevent hub's ``epoll_wait``, for
longer than the test's bound, or (threads) in a lock's ``futex`` wait -- else the
raise is prompt by luck. Only the kernel can tell: :func:`wait_parked` polls
/proc. Where it cannot tell (not Linux, a kernel that hides a thread's wait
channel), every thread counts as parked: the test still runs, only less sharp.
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["PROMPT", "parked", "wait_parked"]

#: How soon a signal must raise where the main thread waits (seconds): its handler
#: runs at the main thread's next bytecode, which the wake-up gets to at once (0.1 s
#: on an idle box); the rest is a loaded box's slack. A gevent hub left asleep wakes
#: only for its next timer: a lease renewal (10 s), or libev's cap (about a minute).
PROMPT = 3.0


def parked(pid: int, tid: int, backend: str) -> bool:
    """Whether thread ``tid`` of process ``pid`` sleeps: on ``gevent`` in
    ``epoll_wait`` for longer than :data:`PROMPT` (the call's fourth argument is
    its timeout, in ms), on ``threading`` in a futex wait."""
    task = Path(f"/proc/{pid}/task/{tid}")
    try:
        wchan = (task / "wchan").read_text()
        call = (task / "syscall").read_text().split()
    except OSError:  # no /proc (not Linux), or not ours to read: cannot tell
        return True
    if call[:1] == ["running"]:
        return False
    if wchan.strip() in ("", "0"):  # asleep, and the kernel hides where
        return True
    if backend == "threading":
        return "futex" in wchan
    return "epoll" in wchan and len(call) >= 5 and int(call[4], 16) >= PROMPT * 1000


def wait_parked(pid: int, tid: int, backend: str, timeout: float = 30.0) -> None:
    """Return once :func:`parked` says so; ``AssertionError`` past ``timeout``.
    Polled: no event of the process's can tell that it sleeps."""
    deadline = time.monotonic() + timeout
    while not parked(pid, tid, backend):
        assert time.monotonic() < deadline, f"thread {tid} of {pid} never went to sleep"
        time.sleep(0.005)
