"""A bound on reading the rest of a streamed answer once its ``data: [DONE]`` came.

The answer is whole at ``[DONE]``; what follows is the end of the HTTP body (the
last chunk of a chunked one). Reading it lets the connection go back to the pool
for the turn's next request instead of being closed -- but a server that keeps the
body open after ``[DONE]`` (or trickles keep-alive comments) would hold the turn
until the request's timeout (ten minutes by default), with its answer in hand.
:func:`after_done` arms a watchdog that shuts the response's socket down
:data:`DONE_GRACE` seconds later (never past the request's deadline) unless the
read ended first: the blocked read then wakes, and the connection is closed, not
pooled.

The watchdog is a native OS thread, whatever the backend: the read it bounds
blocks an OS thread (the turn's, or a worker of gevent's waiting pool) that no
greenlet of a hub could wake. It lives until the read ends or its grace passes.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from typing import Any, Final

import httpx
from subagents.actors._kernel._gevent import native_allocate_lock, native_start_thread

__all__ = ["DONE_GRACE", "DoneGrace", "after_done", "shutdown"]

logger = logging.getLogger("subagents")

#: Seconds the rest of a body may take after its ``[DONE]`` (a server that ends
#: its body sends the last chunk right behind it).
DONE_GRACE: Final = 2.0


def shutdown(sock: Any) -> None:
    """Shut ``sock`` down for both directions, which wakes a thread blocked reading
    it (a close would not); errors of a socket already gone are ignored."""
    with contextlib.suppress(OSError, TypeError, ValueError):
        # The plain socket's shutdown, also on an SSLSocket: it wakes a blocked reader.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class DoneGrace:
    """Shuts ``sock`` down after ``seconds`` unless :meth:`cancel` came first."""

    __slots__ = ("_lock", "_sock")

    def __init__(self, sock: Any, seconds: float) -> None:
        self._sock = sock
        self._lock = native_allocate_lock()
        self._lock.acquire()  # released by cancel: the watchdog's wait ends early
        native_start_thread(self._watch, (max(0.0, seconds),))  # RuntimeError: none

    def _watch(self, seconds: float) -> None:
        if not self._lock.acquire(True, seconds):
            shutdown(self._sock)

    def cancel(self) -> None:
        """The read ended: the socket is left alone (call once)."""
        self._lock.release()


def after_done(response: httpx.Response, deadline: float) -> DoneGrace | None:
    """A watchdog on ``response``'s socket for the rest of its body (see the module
    docstring), ending at :data:`DONE_GRACE` or ``deadline`` (``time.monotonic``),
    whichever is first; None when the response shows no socket, or no thread can
    be started for it (the rest is then read as before: until the deadline)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        return None
    try:
        return DoneGrace(sock, min(DONE_GRACE, deadline - time.monotonic()))
    except RuntimeError:  # no thread to be had: the answer is whole, its rest read on
        logger.warning("no watchdog on the rest of a model answer's body", exc_info=True)
        return None
