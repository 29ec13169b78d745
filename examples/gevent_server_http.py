"""The HTTP side of ``gevent_server.py``: the pywsgi server, bodies, JSON, bearer tokens.

Nothing here knows about agents; it is what any small gevent JSON server needs to
get right:

* :class:`NoDelayServer` sets ``TCP_NODELAY`` on every accepted socket. pywsgi
  writes a response's headers and its body in two ``send`` calls; with Nagle's
  algorithm on, the body waits for the client to acknowledge the headers, and
  the client delays that acknowledgement (about 40 ms on Linux). A keep-alive
  client then gets some 20 responses a second, a client opening a new
  connection each time hundreds (its first segment is never held).
* :func:`read_json` reads a body given by ``Content-Length`` or sent
  ``Transfer-Encoding: chunked`` (pywsgi decodes it and ends the input there),
  refusing one larger than a limit (413) instead of reading it as empty, and
  parses it strictly: ``NaN``, ``Infinity`` and numbers that overflow a float
  (``1e400``) are not JSON, and are refused (400) instead of becoming ``inf``.
* :func:`respond` writes standard JSON only (``allow_nan=False``); a non-finite
  float some behaviour produced is sent as the string ``"NaN"``, ``"Infinity"``
  or ``"-Infinity"``, as protobuf's JSON mapping does.
* :func:`check_bearer` tells a missing header, a malformed one and a wrong token
  apart (401 each, with RFC 6750's ``WWW-Authenticate`` error).
"""

from __future__ import annotations

import hmac
import http
import json
import math
import socket
from collections.abc import Callable, Iterable
from typing import Any

from gevent.pywsgi import WSGIServer

__all__ = [
    "MAX_BODY",
    "HttpError",
    "NoDelayServer",
    "Start",
    "check_bearer",
    "dumps",
    "error",
    "jsonable",
    "read_json",
    "respond",
]

Start = Callable[[str, list[tuple[str, str]]], Any]

#: The largest request body read, in bytes (a larger one is refused with 413).
MAX_BODY = 1_000_000


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
    """pywsgi's server with ``TCP_NODELAY`` on each accepted connection (see above)."""

    def handle(self, sock: Any, address: Any) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().handle(sock, address)


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
            from a chunked one); 400 for a bad ``Content-Length``, a body that is
            not strict JSON, or JSON that is not an object.
    """
    chunked = environ.get("HTTP_TRANSFER_ENCODING", "").lower() == "chunked"
    if chunked:
        raw = environ["wsgi.input"].read(limit + 1)  # pywsgi stops at the last chunk
    else:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise _bad("the Content-Length header is not a number") from None
        if length < 0:
            raise _bad("the Content-Length header is negative")
        if length > limit:
            raise _too_large(limit)
        raw = environ["wsgi.input"].read(length) if length else b""
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


def respond(
    start_response: Start,
    status: int,
    payload: Any,
    headers: Iterable[tuple[str, str]] = (),
) -> list[bytes]:
    """Send ``payload`` as the JSON response, with its length (keep-alive needs it)."""
    body = dumps(payload).encode()
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
