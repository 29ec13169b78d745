"""A runtime's listening connection dropped on the way (R-DUR, issue 14: wake-ups
on PostgreSQL; a live holder keeps its sessions).

A NAT or firewall idle timeout, a failover, or a network cut can end the
connection at the server while nothing -- no FIN, no RST -- reaches the client:
its socket stays open and silent. The server no longer shows the channel, so
every other holder's sweep finds this holder's work unheard and takes it up after
a grace, while the holder's rings are lost. The holder's own sweep finds itself
among the unheard and reopens its connection.

The drop is real: the runtime reaches the server through a loopback TCP proxy
that closes the server's side of the listener's connection and keeps the
client's side open and silent.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend

pytestmark = pytest.mark.timeout(120)


class _Proxy:
    """Forwards loopback TCP connections to the server; :meth:`drop` ends one at
    the server (by the client's port) and leaves the client's side open, unread,
    unanswered."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._server = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listening = socket.create_server(("127.0.0.1", 0))
        port = self._listening.getsockname()[1]
        self.url = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))
        self._pairs: dict[int, tuple[socket.socket, socket.socket]] = {}
        self._dropped: set[int] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        self._listening.settimeout(0.05)  # (a close from another thread wakes no accept)
        while not self._closed:
            try:
                client, (_host, port) = self._listening.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            server = socket.create_connection(self._server)
            with self._lock:
                self._pairs[port] = (client, server)
            t = threading.Thread(target=self._pump, args=(port, client, server), daemon=True)
            self._threads.append(t)
            t.start()

    def _pump(self, port: int, client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not self._closed and port not in self._dropped:
                readable = select.select([client, server], [], [], 0.05)[0]
                for src, dst in ((client, server), (server, client)):
                    if src in readable and port not in self._dropped:
                        data = src.recv(65536)
                        if not data:
                            return
                        dst.sendall(data)

    def drop(self, client_port: int) -> None:
        with self._lock:
            self._dropped.add(client_port)
            _client, server = self._pairs[client_port]
        server.close()  # the server sees the end; the client is never told

    def close(self) -> None:
        self._closed = True
        self._listening.close()
        with self._lock:
            for client, server in self._pairs.values():
                client.close()
                server.close()
        for t in self._threads:
            t.join(10)


def _port_of(listener: Any) -> int:
    """The client-side port of the listener's connection."""
    fd = listener.fileno()
    assert fd is not None
    with socket.socket(fileno=socket.dup(fd)) as sock:
        port: int = sock.getsockname()[1]
    return port


def _shown(server_url: str, name: str) -> int:
    with psycopg.connect(server_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_holder_whose_listening_connection_was_dropped_silently_reopens_it(
    backend: Backend, pg_url: str
) -> None:
    """A holder with accepted work waiting behind a running turn loses its
    listener's connection on the way: its own sweep finds itself unheard, reopens
    it under the same channel, and a ring reaches it again."""
    proxy = _Proxy(pg_url)
    server_url = pg_url.split("?")[0]
    try:
        with Runtime(proxy.url, backend=backend, lease_ttl=3.0) as rt:
            hold = backend.event()
            rt.models.register("hold", lambda _o: lambda turn: hold.wait(60))
            agent = rt.spawn("hold")
            agent.followup("busy")  # the turn runs and holds
            agent.followup("waiting")  # accepted work under this holder's lease
            listener: Any = rt.mail._listener
            channel = listener.channel
            assert _shown(server_url, channel) == 1
            proxy.drop(_port_of(listener))
            deadline = time.monotonic() + 60
            dropped_seen = False
            while time.monotonic() < deadline:  # a deadline poll for the sweep's progress
                shown = _shown(server_url, channel)
                dropped_seen = dropped_seen or shown == 0
                if dropped_seen and shown == 1:
                    break
                hold.wait(0.05)
            assert dropped_seen and _shown(server_url, channel) == 1, "never reopened"
            hold.set()
            assert agent.wait_idle(60)
    finally:
        proxy.close()
