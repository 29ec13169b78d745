"""A loopback TCP proxy in front of a PostgreSQL server that loses a COMMIT's answer.

``CommitCut(url)`` listens on a free loopback port and forwards every connection
to the server ``url`` names; ``cut.url`` is ``url`` through the proxy. After
``arm()``, the next client packet holding ``COMMIT`` is forwarded, the proxy waits
for the server's answer to it (so the server has committed), and then cuts that
connection both ways without passing the answer on: the client sees its connection lost at its
COMMIT, the commit has happened -- the outcome ``docs/postgres.md`` calls unknown.
``arm(forward=False)`` cuts before the COMMIT reaches the server (it never
happens; the client cannot tell the difference). Its threads are real threads,
joined by ``close()``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from urllib.parse import urlsplit, urlunsplit

__all__ = ["CommitCut"]

_NEEDLE = b"COMMIT"


class CommitCut:
    """See the module docstring."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        port = self._listener.getsockname()[1]
        user = parts.netloc.rpartition("@")[0]
        user = f"{user}@" if user else ""
        self.url = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))
        self._lock = threading.Lock()
        self._armed = 0
        self._forward = True
        self.cuts = 0
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._start(self._accept)

    def arm(self, times: int = 1, *, forward: bool = True) -> None:
        """Cut the connection of each of the next ``times`` COMMITs (see the module doc)."""
        with self._lock:
            self._armed, self._forward = times, forward

    def close(self) -> None:
        """Stop accepting, close every connection, and join the threads."""
        self._stopped.set()
        for thread in list(self._threads):
            thread.join(10)
        self._listener.close()

    def __enter__(self) -> CommitCut:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _start(self, fn: object, *args: object) -> None:
        thread = threading.Thread(target=fn, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            ready, _, _ = select.select([self._listener], [], [], 0.05)
            if not ready:
                continue
            client, _ = self._listener.accept()
            try:
                server = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            self._start(self._pump, client, server)

    def _hit(self, data: bytes) -> tuple[bool, bool]:
        """Whether ``data`` is a COMMIT to cut, and whether to forward it first."""
        with self._lock:
            if self._armed <= 0 or _NEEDLE not in data:
                return False, True
            self._armed -= 1
            self.cuts += 1
            return True, self._forward

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while not self._stopped.is_set():
                ready, _, _ = select.select([client, server], [], [], 0.05)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is server:
                        client.sendall(data)
                        continue
                    cut, forward = self._hit(data)
                    if forward:
                        server.sendall(data)
                    if cut:
                        if forward:  # its answer says the server committed: dropped
                            select.select([server], [], [], 10.0)
                        return
        except OSError:
            return
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
