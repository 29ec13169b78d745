"""The HTTP side of ``gevent_server.py``: the pywsgi server, bodies, JSON, bearer tokens.

Nothing here knows about agents; it is what any small gevent JSON server needs to
get right:

* :class:`NoDelayServer` sets ``TCP_NODELAY`` on every accepted socket. pywsgi
  writes a response's headers and its body in two ``send`` calls; with Nagle's
  algorithm on, the body waits for the client to acknowledge the headers, and
  the client delays that acknowledgement (about 40 ms on Linux). A keep-alive
  client then gets some 20 responses a second, a client opening a new
  connection each time hundreds (its first segment is never held).
* It also stops gracefully. Its connections are greenlets of a bounded pool
  (:data:`MAX_CONNECTIONS`; past it, new ones wait in the listen backlog), so
  ``stop(timeout)`` refuses new connections and then waits up to ``timeout``
  for the requests in flight (without a pool, pywsgi's ``stop`` returns at once,
  and whatever the caller closes next closes under them). The connections the
  listen backlog holds when it stops (the client connected, the server had not
  accepted it yet: its pool full, or its hub busy) are accepted first and
  answered as below, not reset by the listener's closing (a client whose
  request was sent could not tell whether it ran). Once stopping, a
  kept-alive connection takes no new request: one waiting idly for its next
  request is closed, a request that arrives anyway is refused (503
  ``SHUTTING_DOWN``, ``Retry-After``), and every response says ``Connection:
  close``. A request still running when ``timeout`` ends is cut short (pywsgi
  kills its greenlet) and answered 503 ``SHUTTING_DOWN`` too: what it asked for
  may yet take effect (a commit under way goes on), so the answer says its
  outcome is unknown and to send it again with the same ``message_id``. (A
  connection arriving at the very moment the listener closes can still be
  refused or reset, by the kernel: the client sees that its connect failed.)
* :func:`read_json` reads a body given by ``Content-Length`` or sent
  ``Transfer-Encoding: chunked`` (pywsgi decodes it and ends the input there),
  refusing one larger than a limit (413) instead of reading it as empty, and
  parses it strictly: ``NaN``, ``Infinity`` and numbers that overflow a float
  (``1e400``) are not JSON, and are refused (400) instead of becoming ``inf``.
  A body that cannot be read -- shorter than its ``Content-Length``, a chunked
  one cut off or with a chunk size that is no number -- is refused (400, and
  the connection closes: where the next request would start is unknown).
* :func:`respond` writes standard JSON only (``allow_nan=False``); a non-finite
  float some behaviour produced is sent as the string ``"NaN"``, ``"Infinity"``
  or ``"-Infinity"``, as protobuf's JSON mapping does. A large answer is encoded
  off the hub (in gevent's thread pool) and given to it :class:`Encoded`.
* :func:`check_bearer` tells a missing header, a malformed one and a wrong token
  apart (401 each, with RFC 6750's ``WWW-Authenticate`` error).
"""

from __future__ import annotations

import contextlib
import hmac
import http
import json
import math
import select
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

import gevent
import gevent.pool
from gevent.pywsgi import WSGIHandler, WSGIServer

__all__ = [
    "MAX_BODY",
    "MAX_CONNECTIONS",
    "RETRY_AFTER",
    "Encoded",
    "HttpError",
    "NoDelayServer",
    "Start",
    "check_bearer",
    "dumps",
    "error",
    "int_param",
    "jsonable",
    "query",
    "read_json",
    "respond",
]

Start = Callable[[str, list[tuple[str, str]]], Any]

#: The largest request body read, in bytes (a larger one is refused with 413).
MAX_BODY = 1_000_000

#: Connections served at once (kept-alive ones and ``/events`` streams included);
#: more wait in the listen backlog until one ends.
MAX_CONNECTIONS = 1000

#: Seconds a 503 asks the client to wait before it tries again (``Retry-After``).
RETRY_AFTER = 2


class HttpError(Exception):
    """Refuse a request: ``status``, an error ``code`` and a message for the client."""

    def __init__(
        self, status: int, code: str, message: str, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = list(headers)


class NoDelayServer(WSGIServer):  # type: ignore[misc]
    """pywsgi's server with ``TCP_NODELAY`` on each accepted connection, at most
    ``max_connections`` of them, that stops gracefully (see above)."""

    def __init__(
        self, listener: Any, application: Any, *, max_connections: int = MAX_CONNECTIONS, **kw: Any
    ) -> None:
        pool = gevent.pool.Pool(max_connections)
        super().__init__(listener, application, spawn=pool, handler_class=_Handler, **kw)
        self.waiting: set[_Handler] = set()  # connections waiting for their next request
        # The connections taken from the backlog while stopping: outside the pool (it
        # may be full), and waited for as long as it is.
        self.backlogged = gevent.pool.Group()

    def handle(self, sock: Any, address: Any) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().handle(sock, address)

    def close(self) -> None:
        """Stop accepting (``stop`` calls it first): accept the connections the listen
        backlog holds, close the listener, then answer them as a stopping server
        does, and close the connections waiting for a request that has not begun
        to arrive."""
        queued = self._accept_backlog() if self.started else []
        super().close()
        for sock, address in queued:
            self.backlogged.spawn(self._serve_backlogged, sock, address)
        for handler in list(self.waiting):
            handler.hang_up()

    def stop(self, timeout: float | None = None) -> None:
        """pywsgi's ``stop``; the connections taken from the backlog are given the same
        ``timeout``, then ended."""
        deadline = time.monotonic() + (self.stop_timeout if timeout is None else timeout)
        super().stop(timeout)
        self.backlogged.join(timeout=max(0.0, deadline - time.monotonic()))
        self.backlogged.kill(block=True, timeout=1)

    def _accept_backlog(self) -> list[tuple[Any, Any]]:
        """The connections the listener holds now, accepted without waiting (as many as
        its backlog, at most: a flood arriving meanwhile does not keep it open)."""
        queued: list[tuple[Any, Any]] = []
        for _ in range(self.backlog):
            try:
                accepted = self.do_read()  # None: the backlog is empty
            except OSError:  # one aborted by its client, or no descriptor left
                break
            if not accepted:
                break
            queued.append(accepted)
        return queued

    def _serve_backlogged(self, sock: Any, address: Any) -> None:
        try:
            self.handle(sock, address)
        finally:
            sock.close()


class _Handler(WSGIHandler):  # type: ignore[misc]
    """Serves no new request once its server is stopping (``server.closed``)."""

    def read_requestline(self) -> str:
        if self.server.closed and not self._arriving():
            return ""  # as if the client had closed: the connection ends
        self.server.waiting.add(self)
        try:
            return str(super().read_requestline())
        finally:
            self.server.waiting.discard(self)

    def hang_up(self) -> None:
        """End the connection, unless a request is arriving (it is then refused)."""
        if not self._arriving():
            with contextlib.suppress(OSError):  # the client left already
                self.socket.shutdown(socket.SHUT_RDWR)  # the waiting read ends: no request

    def _arriving(self) -> bool:
        poll = select.poll()
        poll.register(self.socket.fileno(), select.POLLIN)
        return bool(poll.poll(0))

    def handle_one_response(self) -> None:
        if self.server.closed:
            self.application = _shutting_down
        super().handle_one_response()

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Any:
        if self.server.closed and not any(k.lower() == "connection" for k, _ in headers):
            headers = [*headers, ("Connection", "close")]
        return super().start_response(status, headers, exc_info)

    def handle_error(self, t: type[BaseException], v: BaseException, tb: Any) -> None:
        """A request the stopping server's drain outlasted (its greenlet killed):
        503 ``SHUTTING_DOWN``, its outcome unknown, instead of pywsgi's bare 500."""
        if not issubclass(t, gevent.GreenletExit):
            return super().handle_error(t, v, tb)  # type: ignore[no-any-return]
        self.close_connection = True
        if self.response_length:
            return None  # the response was begun: the connection ends it
        with contextlib.suppress(OSError):  # the client left already
            for chunk in _cut_short(self.environ, self.start_response):
                self.write(chunk)
        return None


def _shutting_down(environ: dict[str, Any], start_response: Start) -> list[bytes]:
    message = "the server is shutting down: send the request again (to another worker)"
    retry = [("Retry-After", str(RETRY_AFTER)), ("Connection", "close")]
    return respond(start_response, 503, error("SHUTTING_DOWN", message), retry)


def _cut_short(environ: dict[str, Any], start_response: Start) -> list[bytes]:
    message = (
        "the server stopped before this request finished: whether it took effect is"
        " unknown (it may yet). Send it again (to another worker) with the same"
        " message_id -- it is then accepted once; one sent without a message_id may"
        " be applied twice"
    )
    retry = [("Retry-After", str(RETRY_AFTER)), ("Connection", "close")]
    return respond(start_response, 503, error("SHUTTING_DOWN", message), retry)


def check_bearer(environ: dict[str, Any], token: str) -> None:
    """Require ``Authorization: Bearer <token>``; a distinct 401 for each way to fail."""
    header = environ.get("HTTP_AUTHORIZATION", "").strip()
    if not header:
        raise _unauthenticated("no Authorization header: send 'Authorization: Bearer TOKEN'")
    scheme, _, given = header.partition(" ")
    given = given.strip()
    if scheme.lower() != "bearer" or not given or " " in given:
        raise _unauthenticated(
            "the Authorization header is malformed: expected 'Bearer TOKEN'",
            'Bearer error="invalid_request"',
        )
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise _unauthenticated("the bearer token is not valid", 'Bearer error="invalid_token"')


def _unauthenticated(message: str, challenge: str = "Bearer") -> HttpError:
    return HttpError(401, "UNAUTHENTICATED", message, [("WWW-Authenticate", challenge)])


def read_json(environ: dict[str, Any], limit: int = MAX_BODY) -> dict[str, Any]:
    """The request's body as a JSON object (``{}`` when there is none).

    Raises:
        HttpError: 413 for a body over ``limit`` bytes (declared, or read so far
            from a chunked one); 400 for a bad ``Content-Length``, a body that
            cannot be read (see the module docstring), is not strict JSON, or is
            JSON that is not an object.
    """
    chunked = environ.get("HTTP_TRANSFER_ENCODING", "").lower() == "chunked"
    if chunked:
        raw = _read(environ, limit + 1)  # pywsgi stops at the last chunk
    else:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise _bad("the Content-Length header is not a number") from None
        if length < 0:
            raise _bad("the Content-Length header is negative")
        if length > limit:
            raise _too_large(limit)
        raw = _read(environ, length) if length else b""
    if len(raw) > limit:
        raise _too_large(limit)
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except _NotFinite as exc:
        raise _bad(f"the body holds {exc}, which JSON cannot represent") from None
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise _bad("the body is not JSON") from None
    if not isinstance(data, dict):
        raise _bad("the body must be a JSON object")
    return data


def query(environ: dict[str, Any]) -> dict[str, str]:
    """The request's query parameters (the last of each name given twice)."""
    return dict(urllib.parse.parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True))


def int_param(params: dict[str, str], name: str, default: int, low: int, high: int | None) -> int:
    """Query parameter ``name``, an int from ``low`` to ``high`` (400 if it is not)."""
    text = params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        most = f" and at most {high}" if high is not None else ""
        message = f"{name} must be an int of at least {low}{most}, got {text[:40]!r}"
        raise HttpError(400, "INVALID_ARGUMENT", message)
    return value


def _read(environ: dict[str, Any], size: int) -> bytes:
    try:
        return bytes(environ["wsgi.input"].read(size))
    except OSError as exc:  # cut short (the client closed), or chunks that do not parse
        raise HttpError(
            400, "INVALID_ARGUMENT", f"the body cannot be read: {exc}", [("Connection", "close")]
        ) from None


class _NotFinite(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(f"{text[:40]} (it overflows a float)")
    return value


def _bad(message: str) -> HttpError:
    return HttpError(400, "INVALID_ARGUMENT", message)


def _too_large(limit: int) -> HttpError:
    # The client may still be sending: tell it this connection ends here.
    return HttpError(
        413, "BODY_TOO_LARGE", f"the body is larger than {limit} bytes", [("Connection", "close")]
    )


def jsonable(value: Any) -> Any:
    """``value`` as standard JSON types (see the module docstring for non-finite floats)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def dumps(value: Any) -> str:
    """Standard JSON (never ``NaN`` or ``Infinity``)."""
    return json.dumps(jsonable(value), allow_nan=False)


class Encoded(bytes):
    """A JSON body encoded already (by :func:`dumps`): :func:`respond` sends it as it is."""


def respond(
    start_response: Start,
    status: int,
    payload: Any,
    headers: Iterable[tuple[str, str]] = (),
) -> list[bytes]:
    """Send ``payload`` as the JSON response, with its length (keep-alive needs it)."""
    body = payload if isinstance(payload, Encoded) else dumps(payload).encode()
    start_response(
        f"{status} {http.HTTPStatus(status).phrase}",
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            *headers,
        ],
    )
    return [body]


def error(code: str, message: str) -> dict[str, Any]:
    """The body of an error response."""
    return {"error": {"code": code, "message": message}}
