"""A doorbell: wake another process's runtime, on this host, without it polling.

A runtime that holds leases binds one datagram socket -- on Linux in the abstract
namespace (``@subagents-...``: no file is left behind), elsewhere a socket file
in the temporary directory -- and records its address in every lease it takes.
A process that accepts a message for a session another process holds rings that
holder's doorbell with the session's id; the holder wakes, reads what waits in
the session's durable inbox and delivers it. Blocked in ``recv``, an idle
holder costs no CPU.

A store that reaches further than one host (PostgreSQL: ``LISTEN/NOTIFY``)
gives the runtime a *listener* (:meth:`subagents.store.SessionStore.listen`):
the doorbell then waits on both its socket and the listener's connection, and
its address -- the one leases record -- is the listener's, which any process on
any host rings through the store (:meth:`~subagents.store.SessionStore.notify`).
The socket stays, for this process's own rings and for :meth:`Doorbell.close`.

A ring is only a hint, never the message: it may be lost (the holder is gone,
its buffer is full, the listener's connection dropped) and then the holder's
periodic sweep finds the message anyway. So :func:`ring` never blocks and
never raises, and a listener that had to reconnect makes :meth:`Doorbell.wait`
return as a timeout does (sweep now).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any, Final, Protocol

import gevent.select
import gevent.socket

from . import _fork
from ._backend import Backend

__all__ = ["Doorbell", "ring"]

#: The largest ring: 64 session ids of 16 bytes.
MAX_RING: Final = 1024
#: While a listener is disconnected, how often to try it again (seconds).
_RECONNECT: Final = 2.0

_ABSTRACT = sys.platform.startswith("linux")


class Listener(Protocol):
    """What the doorbell needs of a store's listener (``subagents.store.Listener``,
    restated here: the kernel imports nothing above it)."""

    address: str

    def fileno(self) -> int | None: ...
    def receive(self) -> list[bytes] | None: ...
    def reconnect(self) -> bool: ...


def _sockaddr(address: str) -> str:
    """The socket address of a doorbell address (``@name``: the abstract namespace)."""
    return "\0" + address[1:] if address.startswith("@") else address


class Doorbell:
    """This runtime's doorbell (see the module docstring).

    ``wait`` is called by one task at a time; ``close`` wakes it. The listener
    stays its owner's to close (after the waiting task ended).
    """

    def __init__(self, backend: Backend, listener: Listener | None = None) -> None:
        green = backend.name == "gevent"
        module: Any = gevent.socket if green else socket
        self._select: Any = gevent.select.select if green else select.select
        # A listener's reconnect blocks (as long as the server's connect timeout
        # when it hangs): off the hub on gevent. Its receive never blocks.
        self._blocking: Any = backend.run_blocking if green else _call
        name = f"subagents-{os.getpid()}-{uuid.uuid4().hex[:16]}"
        #: The socket's address: this process's own rings.
        self.local_address = (
            f"@{name}" if _ABSTRACT else os.path.join(tempfile.gettempdir(), f"{name}.sock")
        )
        self._listener = listener
        #: Where other processes ring (recorded in leases).
        self.address = listener.address if listener is not None else self.local_address
        self._sock = module.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(_sockaddr(self.local_address))
        self._closed = False
        _fork.track(self)

    def __repr__(self) -> str:
        return f"<Doorbell {self.address}>"

    def _forked(self) -> None:
        """In the child of a fork: the parent's rings are not the child's to read.
        The socket's descriptor is pointed at ``/dev/null`` -- no watcher touched,
        nothing the parent shares closed -- so a wait woken in the child reads none
        of them (it fails, and finds the doorbell closed)."""
        self._closed = True
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_RDONLY)
            try:
                os.dup2(null, self._sock.fileno())
            finally:
                os.close(null)

    def _closed_now(self) -> bool:
        # A call, so a type checker does not take the flag for fixed after the
        # first test: close() sets it from another task while we wait.
        return self._closed

    def wait(self, timeout: float | None) -> list[bytes] | None:
        """Block until rung (the rings waiting, in order) or ``timeout`` passed (None);
        a ``timeout`` of 0 or less looks without blocking.

        Returns ``[]`` once closed.
        """
        if self._closed:
            return []
        if self._listener is not None:
            return self._wait_both(self._listener, timeout)
        if timeout is not None and timeout <= 0:
            # A look: a timeout of 0 makes the socket non-blocking, where ``recv``
            # raises BlockingIOError, not TimeoutError (and a negative one is refused).
            try:
                rings = self._drain()
            except OSError:  # EBADF: closed by close() from another task
                if self._closed_now():
                    return []
                raise
            return [] if self._closed_now() else rings or None
        sock = self._sock
        try:
            # Inside the try: close() from another task may close the socket at any
            # point after the check above (EBADF here, not only in recv).
            sock.settimeout(timeout)
            first = sock.recv(MAX_RING)
        except TimeoutError:
            return None
        except OSError:
            if self._closed_now():
                return []
            raise
        if self._closed_now():  # close() rang to wake us
            return []
        return [first, *self._drain()]

    def _drain(self) -> list[bytes]:
        """Everything rung on the socket so far, without blocking."""
        rings: list[bytes] = []
        sock = self._sock
        sock.settimeout(0)
        while True:
            try:
                rings.append(sock.recv(MAX_RING))
            except (BlockingIOError, TimeoutError, InterruptedError):
                return rings
            except OSError:
                return rings

    def _wait_both(self, listener: Listener, timeout: float | None) -> list[bytes] | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            fd = listener.fileno()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if fd is None:  # disconnected: look again every few seconds
                left = _RECONNECT if left is None else min(left, _RECONNECT)
            try:
                readable = self._select(
                    [self._sock] if fd is None else [self._sock, fd], [], [], left
                )[0]
            except (OSError, ValueError):
                readable = []  # the listener's socket closed under us: try it again
                fd = None
            if self._closed_now():
                return []
            rings = self._drain() if self._sock in readable else []
            if fd is None:
                if self._blocking(listener.reconnect):
                    return None  # reconnected: rings may be lost, sweep
            elif fd in readable:
                got = listener.receive()
                if got is None:  # lost: reopen it now; rings may be lost, sweep
                    self._blocking(listener.reconnect)
                    return None
                rings += got
            if rings:
                return rings
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def drop_listener(self) -> None:
        """Let the listener's connection go (one the store no longer shows: dropped
        silently on the way) and reopen it (blocking, off the hub; tried again at
        the next :meth:`wait` if it fails). Called by the task that waits, between
        waits; a listener without ``drop`` is left as is."""
        listener = self._listener
        drop = getattr(listener, "drop", None)
        if listener is None or drop is None or self._closed:
            return
        drop()
        self._blocking(listener.reconnect)

    def close(self) -> None:
        """Stop: a waiter returns ``[]``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        ring(self.local_address, b"")  # wakes a waiter blocked in recv or select
        with contextlib.suppress(OSError):
            self._sock.close()
        if not _ABSTRACT:
            with contextlib.suppress(OSError):
                os.unlink(self.local_address)


def _call(fn: Any) -> Any:
    return fn()


def ring(
    address: str | None,
    payload: bytes,
    patience: float = 0.0,
    sleep: Callable[[float], object] = time.sleep,
) -> bool:
    """Ring the doorbell at ``address`` with ``payload``; False when it could not be
    delivered (nobody there, a full buffer, no address). Never raises; blocks only
    with ``patience``: seconds to ring again, ``sleep`` between, while the buffer
    is full (its holder busy) -- for a ring that carries what no sweep finds again
    (an interrupt)."""
    if not address or len(payload) > MAX_RING:
        return False
    deadline = time.monotonic() + patience
    pause = 0.001
    while True:
        try:  # (the socket too: a process out of descriptors raises EMFILE making it)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except OSError:
            return False
        try:
            sock.sendto(payload, socket.MSG_DONTWAIT, _sockaddr(address))
            return True
        except OSError as exc:
            # A full buffer (the holder's queue of datagrams is short: 10 on Linux
            # by default) is worth waiting for; nobody there is not.
            if exc.errno not in _FULL or time.monotonic() >= deadline:
                return False
        finally:
            sock.close()
        sleep(pause)
        pause = min(pause * 2, 0.05)


#: Errors of a ring that found the doorbell's buffer full.
_FULL: Final = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS})
