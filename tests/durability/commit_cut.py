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

A COMMIT is found by reading the client's protocol messages, not by its text in
a packet: psycopg prepares a statement it ran five times on a connection -- a
Parse of ``COMMIT`` alone, which commits nothing -- and runs it from then on by
its name (Bind, Execute), with no ``COMMIT`` in the packet. The cut is at the
packet that *runs* a COMMIT: a simple query, or the Execute of a portal bound to
a statement whose text is ``COMMIT`` (unnamed, or prepared earlier).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from urllib.parse import urlsplit, urlunsplit

__all__ = ["CommitCut"]

#: Request codes of an untyped message that is not the startup message.
_NEGOTIATIONS = (80877102, 80877103, 80877104)  # cancel, SSL, GSS encryption


#: The server's CommandComplete of a COMMIT that committed (not ``ROLLBACK``).
_COMMITTED = b"C\x00\x00\x00\x0bCOMMIT\x00"


def _is_commit(query: bytes) -> bool:
    return query.strip().rstrip(b";").strip().upper() in (b"COMMIT", b"COMMIT TRANSACTION")


class _Frontend:
    """The client's side of one connection, read message by message: whether a
    packet runs a COMMIT (see the module docstring)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._started = False  # the startup message (untyped) was read
        self._statements: set[bytes] = set()  # names of statements whose text is COMMIT
        self._portals: set[bytes] = set()  # portals bound to one

    def runs_commit(self, data: bytes) -> bool:
        """Read ``data`` (the next bytes the client sent): True when a message it
        completes runs a COMMIT."""
        self._buffer += data
        found = False
        while True:
            buf = self._buffer
            if not self._started:
                if len(buf) < 8:
                    return found
                (size,) = struct.unpack("!i", buf[:4])
                if len(buf) < size:
                    return found
                (code,) = struct.unpack("!i", buf[4:8])
                self._started = code not in _NEGOTIATIONS
                self._buffer = buf[size:]
                continue
            if len(buf) < 5:
                return found
            kind = buf[:1]
            (size,) = struct.unpack("!i", buf[1:5])
            if len(buf) < 1 + size:
                return found
            body = buf[5 : 1 + size]
            self._buffer = buf[1 + size :]
            found = self._read(kind, body) or found

    def _read(self, kind: bytes, body: bytes) -> bool:
        if kind == b"Q":  # a simple query
            return _is_commit(body.split(b"\0", 1)[0])
        if kind == b"P":  # Parse: name, text
            name, text = body.split(b"\0", 2)[:2]
            if _is_commit(text):
                self._statements.add(name)
            else:
                self._statements.discard(name)
        elif kind == b"B":  # Bind: portal, statement
            portal, statement = body.split(b"\0", 2)[:2]
            if statement in self._statements:
                self._portals.add(portal)
            else:
                self._portals.discard(portal)
        elif kind == b"E":  # Execute: portal
            return body.split(b"\0", 1)[0] in self._portals
        return False


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
        #: Cut COMMITs whose dropped answer said the server committed.
        self.committed = 0
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

    def _hit(self, commits: bool) -> tuple[bool, bool]:
        """Whether a packet (running a COMMIT: ``commits``) is to be cut, and
        whether to forward it first."""
        with self._lock:
            if self._armed <= 0 or not commits:
                return False, True
            self._armed -= 1
            self.cuts += 1
            return True, self._forward

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        frontend = _Frontend()
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
                    cut, forward = self._hit(frontend.runs_commit(data))
                    if forward:
                        server.sendall(data)
                    if cut:
                        if forward and _answer(server):  # the server committed: dropped
                            with self._lock:
                                self.committed += 1
                        return
        except OSError:
            return
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def _answer(server: socket.socket) -> bool:
    """Read the server's answer to a forwarded COMMIT (never passed on): whether it
    says the transaction committed. Waits 10 s at most."""
    got = b""
    deadline = time.monotonic() + 10.0
    while _COMMITTED not in got and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([server], [], [], left)
        chunk = server.recv(65536) if ready else b""
        if not chunk:
            break
        got += chunk
    return _COMMITTED in got
