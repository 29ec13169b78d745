"""``subagents serve`` bounds its event streams: each held a thread for as long as
its client stayed, with no limit (400 clients: 402 threads), and a client that
left held its thread until the next keep-alive write, 15 s later."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors._shell._cli import main
from subagents.actors._shell._serve import TreeFeed, TreeServer
from subagents.store import SqliteStore

pytestmark = pytest.mark.timeout(120)

#: A generous bound on what takes a fraction of a second (a loaded 2-core box).
BOUND = 30.0


def _until(what: Any, bound: float = BOUND) -> bool:
    deadline = time.monotonic() + bound
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)  # polling a condition with a bound, not an ordering
    return True


@pytest.fixture
def served(tmp_path: Path, backend: Backend) -> Iterator[TreeServer]:
    """A server of a one-tree store allowing 2 event streams, in a thread here."""
    db = str(tmp_path / "s.db")
    with Runtime(db, backend=backend) as rt:
        rt.spawn("echo", label="served")
    store = SqliteStore(db, read_only=True)
    feed = TreeFeed(store, db, None, 0.05)
    server = TreeServer(feed, "127.0.0.1", 0, None, max_clients=2)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        feed.close()
        store.close()
        thread.join(BOUND)


def _open_stream(server: TreeServer) -> tuple[http.client.HTTPConnection, Any]:
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=BOUND)
    conn.request("GET", "/events")
    return conn, conn.getresponse()


def _first_frame(response: Any) -> str:
    while (line := response.readline().decode()) != "\n":
        if line.startswith("data: "):
            data = line
    return data


def test_streams_past_the_maximum_are_refused_and_a_leaver_frees_its_place(
    served: TreeServer,
) -> None:
    """Beyond the seed (the command line): at most ``max_clients`` event streams;
    one more is ``503`` with ``Retry-After`` at once; a client that closes its
    stream frees its place and its thread promptly (not at the next keep-alive
    15 s later), and a new client then streams."""
    server = served
    before = threading.active_count()
    first, first_response = _open_stream(server)
    second, second_response = _open_stream(server)
    try:
        for response in (first_response, second_response):
            assert response.status == 200
            assert '"served"' in _first_frame(response)
        assert server.streams == 2
        assert threading.active_count() == before + 2
        third, refused = _open_stream(server)
        try:
            assert refused.status == 503
            assert refused.getheader("Retry-After") == "5"
            assert refused.getheader("Connection") == "close"  # no thread kept for it
            assert b"at most 2" in refused.read()
        finally:
            third.close()
        assert server.streams == 2
        second_response.close()  # the client leaves
        second.close()
        assert _until(lambda: server.streams == 1)
        assert _until(lambda: threading.active_count() == before + 1)
        again, response = _open_stream(server)
        try:
            assert response.status == 200
            assert '"served"' in _first_frame(response)
        finally:
            response.close()
            again.close()
    finally:
        for conn, response in ((first, first_response), (second, second_response)):
            response.close()
            conn.close()
    assert _until(lambda: server.streams == 0)
    assert _until(lambda: threading.active_count() == before)


def test_a_stream_whose_client_resets_is_let_go(served: TreeServer) -> None:
    """A client that resets its connection (no orderly close) frees its place too."""
    import struct

    server = served
    host, port = server.server_address[:2]
    sock = socket.create_connection((str(host), int(port)), timeout=BOUND)
    sock.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sock.recv(12) == b"HTTP/1.1 200"
    assert _until(lambda: server.streams == 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    assert _until(lambda: server.streams == 0)


def test_max_clients_must_be_positive(tmp_path: Path, capsys: Any) -> None:
    """``--max-clients 0`` is refused with the other bad arguments (exit 2)."""
    db = str(tmp_path / "s.db")
    with Runtime(db):
        pass
    assert main(["serve", db, "--max-clients", "0"]) == 2
    assert "INVALID_ARGUMENT" in capsys.readouterr().err
