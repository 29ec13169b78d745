"""The doorbell (``_kernel/_doorbell.py``): rings wake a waiter, ``close`` ends its
wait from another task at any point -- never with an exception."""

from __future__ import annotations

from typing import Any

from subagents.actors._kernel import Doorbell, ring
from subagents.actors._kernel._backend import Backend


def test_a_ring_wakes_the_waiter_with_its_payload(backend: Backend) -> None:
    bell = Doorbell(backend)
    try:
        assert ring(bell.local_address, b"x" * 16)
        assert ring(bell.local_address, b"y" * 16)
        assert bell.wait(10) == [b"x" * 16, b"y" * 16]
        assert bell.wait(0.01) is None  # nothing rung: a timeout
    finally:
        bell.close()
    assert bell.wait(10) == []  # closed


def test_a_wait_of_no_time_looks_and_returns(backend: Backend) -> None:
    """The mail task waits for what is left of its sweep period: nothing when a
    round outlasted it. ``wait(0)`` returns the rings already there, else None (a
    timeout); it raised ``BlockingIOError`` (the socket made non-blocking) and the
    mail task died -- that runtime never picked up mail or an interrupt again."""
    bell = Doorbell(backend)
    try:
        for _ in range(3):
            assert bell.wait(0) is None
            assert bell.wait(-1.0) is None  # a deadline already past
        assert ring(bell.local_address, b"z" * 16)
        assert bell.wait(0) == [b"z" * 16]
        assert ring(bell.local_address, b"w" * 16)
        assert bell.wait(10) == [b"w" * 16]  # still blocking after a look
    finally:
        bell.close()


class _ClosingSocket:
    """The doorbell's socket, closed by ``close()`` from "another task" at the worst
    moment: after ``wait`` checked the flag, before it set the timeout."""

    def __init__(self, bell: Doorbell, sock: Any) -> None:
        self._bell, self._sock = bell, sock

    def settimeout(self, timeout: float | None) -> None:
        self._bell._sock = self._sock  # close() closes the real one
        self._bell.close()
        self._sock.settimeout(timeout)  # EBADF: the socket is closed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_close_between_the_check_and_the_wait_ends_the_wait(backend: Backend) -> None:
    """A close racing the mail task's wait: the wait returns ``[]`` (closed); it raised
    ``EBADF`` from ``settimeout`` and the mail task died with a traceback."""
    bell = Doorbell(backend)
    bell._sock = _ClosingSocket(bell, bell._sock)  # type: ignore[assignment]
    assert bell.wait(10) == []


_OUT_OF_DESCRIPTORS = """
import os, resource, sys
from subagents.actors._kernel import ring
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
print(ring("@subagents-nobody-" + sys.argv[1], b"x" * 16))
"""


def test_a_ring_out_of_descriptors_returns_false(tmp_path: Any) -> None:
    """``ring`` never raises: in a process out of file descriptors (making its
    socket fails with EMFILE) it returns False. It raised, and the session writer
    -- which rings this runtime's own pickup after a release that left messages
    waiting -- ended with it."""
    import subprocess
    import sys
    import uuid

    done = subprocess.run(
        [sys.executable, "-c", _OUT_OF_DESCRIPTORS, uuid.uuid4().hex],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
