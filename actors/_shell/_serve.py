"""``subagents serve DB``: the trees of a store, live, in a web page on loopback.

One poller thread reads the store every ``interval`` seconds -- the same reading
as ``subagents tree --json`` -- and publishes the frame when it changed; each
page holds one server-sent-events stream (``/events``) and redraws the trees as
frames arrive: each session's state, durable inbox depth, last turn and last
activity, children under their parents. However many pages are open, the store
is read once per interval. The server is read-only: it has no route that writes.

``--token`` guards every route as the server example does, with the token in an
``Authorization: Bearer`` header or -- for the page and its event stream, which
a browser opens without headers -- in a ``token`` query parameter.

Each event stream holds a thread for as long as its client stays: at most
``--max-clients`` streams (:data:`MAX_CLIENTS` by default) are open at once, and
one more is answered ``503 Service Unavailable`` (with ``Retry-After``) at once,
holding nothing. A stream watches its socket while it waits for the next frame:
a client that leaves (a closed tab, a dropped connection) frees its place and its
thread within :data:`_WATCH` seconds, not at the next keep-alive write.
"""

from __future__ import annotations

import hmac
import http.server
import json
import logging
import select
import socket
import sys
import threading
import urllib.parse
from typing import Any

from subagents.protocol import SubagentError
from subagents.store import SessionStore

from ._output import jsonable
from ._page import PAGE
from ._tree import collect_trees

__all__ = ["MAX_CLIENTS", "TreeFeed", "TreeServer"]

logger = logging.getLogger("subagents")

#: Seconds between two comments on an idle event stream (a dead client is found).
_KEEPALIVE = 15.0
#: Seconds a client may stay silent, or leave what it was sent unread.
_IDLE = 60.0
#: Event streams open at once, by default (``serve --max-clients``).
MAX_CLIENTS = 64
#: Seconds between two looks at a waiting stream's socket (has its client left?).
_WATCH = 0.5


class TreeFeed:
    """The latest frame of the trees, read by one thread every ``interval`` seconds.

    ``frame`` is a JSON object: the trees as ``subagents tree --json`` reads
    them, the database's name, and the read error when the store failed;
    ``version`` grows each time the trees change (and only then).
    """

    def __init__(self, store: SessionStore, db: str, root: str | None, interval: float) -> None:
        self._store, self._db, self._root = store, db, root
        self._interval = interval
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self.version = 0
        self.frame = ""
        self._read()  # the first frame before anyone asks
        self._thread = threading.Thread(target=self._run, name="subagents-serve-feed", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            trees: Any = collect_trees(self._store, self._db, self._root)
            error = None
        except SubagentError as exc:  # the store went away: say so, keep serving
            trees, error = [], str(exc)  # "[CODE] message"
        # Strict JSON on one line (an event's data), rendered as ``tree --json`` does.
        frame = json.dumps(
            jsonable({"db": self._db, "trees": trees, "error": error}),
            allow_nan=False,
            sort_keys=True,
        )
        if frame == self.frame:
            return
        with self._changed:
            self.frame = frame
            self.version += 1
            self._changed.notify_all()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._read()
            except Exception:
                logger.exception("reading the trees of %s failed", self._db)

    def wait(self, after: int, timeout: float) -> tuple[int, str]:
        """The frame newer than version ``after`` (waiting up to ``timeout``), or the
        current one unchanged on timeout."""
        with self._changed:
            self._changed.wait_for(lambda: self.version > after or self._stop.is_set(), timeout)
            return self.version, self.frame

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (event streams end)."""
        return self._stop.is_set()

    def close(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(10)


class TreeServer(http.server.ThreadingHTTPServer):
    """The page, its event stream and one JSON snapshot (see the module docstring)."""

    daemon_threads = True

    def __init__(
        self,
        feed: TreeFeed,
        host: str,
        port: int,
        token: str | None,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.feed = feed
        self.token = token
        self.page = PAGE.encode()
        self.max_clients = max_clients
        self._streams = 0  # event streams open now (under _slots)
        self._slots = threading.Lock()
        # http.server binds IPv4 only: ``--host ::1`` (IPv6's loopback) was refused
        # as "Address family for hostname not supported".
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        self.address_family = family[0][0]
        super().__init__((host, port), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a reset, a closed tab, a client silent past
        :attr:`_Handler.timeout`) is its business: logged at debug, where
        socketserver printed a traceback per client. Anything else is logged."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            logger.debug("serve: client %s went away", client_address, exc_info=True)
        else:
            logger.exception("serve: answering %s failed", client_address)

    @property
    def streams(self) -> int:
        """How many event streams are open now."""
        return self._streams

    def take_stream(self) -> bool:
        """Take a place for one more event stream; False when all are taken."""
        with self._slots:
            if self._streams >= self.max_clients:
                return False
            self._streams += 1
            return True

    def leave_stream(self) -> None:
        """Give back the place of an event stream that ended."""
        with self._slots:
            self._streams -= 1

    @property
    def url(self) -> str:
        address, port = self.server_address[:2]
        host = str(address)
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"

    def authorized(self, headers: Any, query: dict[str, list[str]]) -> bool:
        if self.token is None:
            return True
        scheme, _, given = headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer":
            given = (query.get("token") or [""])[0]
        return hmac.compare_digest(given.strip().encode(), self.token.encode())


class _Handler(http.server.BaseHTTPRequestHandler):
    server: TreeServer
    protocol_version = "HTTP/1.1"
    #: Seconds a connection may stay silent (a kept-alive one between requests, a
    #: client reading nothing): its thread is let go then.
    timeout = _IDLE

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("serve: " + format, *args)

    def do_GET(self) -> None:
        try:
            url = urllib.parse.urlsplit(self.path)
        except ValueError:  # a target urllib cannot split (``http://[::1/``): tell nothing
            self._send(400, "text/plain", b"bad request\n")
            return
        query = urllib.parse.parse_qs(url.query)
        if not self.server.authorized(self.headers, query):  # before telling what exists
            self._send(401, "text/plain", b"a token is required: ?token=TOKEN\n")
            return
        if url.path not in ("/", "/events", "/tree.json"):
            self._send(404, "text/plain", b"not found\n")
            return
        feed = self.server.feed
        if url.path == "/":
            self._send(200, "text/html; charset=utf-8", self.server.page)
        elif url.path == "/tree.json":
            self._send(200, "application/json", feed.frame.encode())
        elif not self.server.take_stream():
            limit = self.server.max_clients
            body = f"too many event streams: at most {limit} at once (--max-clients)\n"
            self._send(503, "text/plain", body.encode(), retry=True)
        else:
            try:
                self._stream(feed)
            finally:
                self.server.leave_stream()

    def _send(self, status: int, kind: str, body: bytes, *, retry: bool = False) -> None:
        self.send_response(status)
        if retry:  # a browser's EventSource reconnects by itself; others are told when
            self.send_header("Retry-After", "5")
            # Nor does a refused client keep its connection (and a thread) open.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, feed: TreeFeed) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        seen = -1
        quiet = 0.0  # seconds since the last write
        try:
            while not feed.closed:
                version, frame = feed.wait(seen, _WATCH)
                if version == seen:
                    quiet += _WATCH
                    if self._gone():
                        return  # the client left: its place and thread are freed now
                    if quiet < _KEEPALIVE:
                        continue
                    self.wfile.write(b": keep-alive\n\n")
                else:
                    seen = version
                    self.wfile.write(f"id: {version}\ndata: {frame}\n\n".encode())
                quiet = 0.0
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return  # the page was closed

    def _gone(self) -> bool:
        """Whether the stream's client closed its end (a stream's client sends
        nothing after its request: a readable socket is its end, or a reset)."""
        sock = self.connection
        try:
            if hasattr(select, "poll"):  # select() refuses a descriptor past 1023
                poller = select.poll()
                poller.register(sock, select.POLLIN)
                readable = bool(poller.poll(0))
            else:  # pragma: no cover - no poll(): Windows
                readable = bool(select.select([sock], [], [], 0)[0])
            return readable and sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True  # a reset: gone too
