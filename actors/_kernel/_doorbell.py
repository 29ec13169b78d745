"""A doorbell: wake another process's runtime, on this host, without it polling.

A runtime that holds leases binds one datagram socket -- on Linux in the abstract
namespace (``@subagents-...``: no file is left behind), elsewhere a socket file
in the temporary directory -- and records its address in every lease it takes.
A process that accepts a message for a session another process holds rings that
holder's doorbell with the session's id; the holder wakes, reads what waits in
the session's durable inbox and delivers it. Blocked in ``recv``, an idle
holder costs no CPU.

A ring is only a hint, never the message: it may be lost (the holder is gone,
its buffer is full) and then the holder's periodic sweep finds the message
anyway. So :func:`ring` never blocks and never raises.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import uuid
from typing import Any, Final

import gevent.socket

from ._backend import Backend

__all__ = ["Doorbell", "ring"]

#: The largest ring: 64 session ids of 16 bytes.
MAX_RING: Final = 1024

_ABSTRACT = sys.platform.startswith("linux")


def _sockaddr(address: str) -> str:
    """The socket address of a doorbell address (``@name``: the abstract namespace)."""
    return "\0" + address[1:] if address.startswith("@") else address


class Doorbell:
    """This runtime's doorbell (see the module docstring).

    ``wait`` is called by one task at a time; ``close`` wakes it.
    """

    def __init__(self, backend: Backend) -> None:
        module: Any = gevent.socket if backend.name == "gevent" else socket
        name = f"subagents-{os.getpid()}-{uuid.uuid4().hex[:16]}"
        self.address = (
            f"@{name}" if _ABSTRACT else os.path.join(tempfile.gettempdir(), f"{name}.sock")
        )
        self._sock = module.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(_sockaddr(self.address))
        self._closed = False

    def __repr__(self) -> str:
        return f"<Doorbell {self.address}>"

    def _closed_now(self) -> bool:
        # A call, so a type checker does not take the flag for fixed after the
        # first test: close() sets it from another task while we wait.
        return self._closed

    def wait(self, timeout: float | None) -> list[bytes] | None:
        """Block until rung (the rings waiting, in order) or ``timeout`` passed (None).

        Returns ``[]`` once closed.
        """
        if self._closed:
            return []
        sock = self._sock
        sock.settimeout(timeout)
        try:
            first = sock.recv(MAX_RING)
        except TimeoutError:
            return None
        except OSError:
            if self._closed_now():
                return []
            raise
        if self._closed_now():  # close() rang to wake us
            return []
        rings = [first]
        sock.settimeout(0)
        while True:  # everything else rung meanwhile, without blocking
            try:
                rings.append(sock.recv(MAX_RING))
            except (BlockingIOError, TimeoutError, InterruptedError):
                return rings
            except OSError:
                return rings

    def close(self) -> None:
        """Stop: a waiter returns ``[]``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        ring(self.address, b"")  # wakes a waiter blocked in recv
        with contextlib.suppress(OSError):
            self._sock.close()
        if not _ABSTRACT:
            with contextlib.suppress(OSError):
                os.unlink(self.address)


def ring(address: str | None, payload: bytes) -> bool:
    """Ring the doorbell at ``address`` with ``payload``; False when it could not be
    delivered (nobody there, a full buffer, no address). Never blocks or raises."""
    if not address or len(payload) > MAX_RING:
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.sendto(payload, socket.MSG_DONTWAIT, _sockaddr(address))
    except OSError:
        return False
    finally:
        sock.close()
    return True
