"""What ``gevent_server.py`` does when something fails.

* :func:`answer_failure` answers a failed request. A ``SubagentError`` gets the
  status its code calls for: the client's mistakes are 4xx (an unlisted code is
  400); the server's own failures are 5xx -- 503 with ``Retry-After`` while the
  store cannot be reached or the runtime is closing (``PERSISTENCE_UNAVAILABLE``,
  ``STORE_CLOSED``, ``RUNTIME_CLOSED``: the same request may succeed later, or on
  another worker), 504 for ``TIMEOUT``, 502 for a model's ``MODEL_ERROR``, 500
  for damaged data and the rest (``CORRUPT_RECORD``, ``DATABASE_CORRUPT``,
  ``INTERNAL``...), each logged without a traceback. Any other exception is a
  bug: a 500 whose body is the usual JSON error, code ``INTERNAL``, with its
  traceback logged once (the client is not shown it).
* :func:`readable_roots` and :func:`read_session` read around damaged rows, as
  ``docs/errors.md`` says a reader should ("one bad row never hides the rest"):
  what decodes is served, and each damaged row is named in ``diagnostics``.
  :func:`read_session` reads a session a page at a time, off the hub.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gevent_server_http import RETRY_AFTER, Encoded, HttpError, Start, dumps, error, respond
from subagents.actors import Runtime
from subagents.protocol import (
    CorruptRecordError,
    ErrorCode,
    SessionHeader,
    SessionId,
    SubagentError,
    event_to_wire,
)

__all__ = [
    "MAX_PAGE",
    "PAGE",
    "PAGE_BYTES",
    "answer_failure",
    "read_session",
    "readable_roots",
    "status_of",
]

#: Records a page of ``GET /sessions/{id}`` holds unless ``limit`` says otherwise,
#: and the most ``limit`` may ask for.
PAGE = 1000
MAX_PAGE = 10_000
#: A page ends early once its JSON passes this many bytes (it holds one record at least).
PAGE_BYTES = 4_000_000

logger = logging.getLogger("gevent_server")

_STATUS = {
    # The client's: the request cannot succeed as it is (any code not listed: 400).
    ErrorCode.UNAUTHORIZED: 403,
    ErrorCode.SESSION_NOT_FOUND: 404,
    ErrorCode.PROVIDER_NOT_FOUND: 404,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.ADMISSION_CLOSED: 409,
    ErrorCode.LEASE_HELD: 409,
    ErrorCode.AGENT_DISPOSED: 409,
    ErrorCode.CANCELLED: 409,
    # The server's: unavailable for now (Retry-After), or broken.
    ErrorCode.PERSISTENCE_UNAVAILABLE: 503,
    ErrorCode.STORE_CLOSED: 503,
    ErrorCode.RUNTIME_CLOSED: 503,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.MODEL_ERROR: 502,
    ErrorCode.INTERNAL: 500,
    ErrorCode.CORRUPT_RECORD: 500,
    ErrorCode.DATABASE_CORRUPT: 500,
    ErrorCode.DESCRIPTOR_CORRUPT: 500,
    ErrorCode.DESCRIPTOR_UNSUPPORTED: 500,
    ErrorCode.NOT_A_DATABASE: 500,
    ErrorCode.SCHEMA_TOO_NEW: 500,
    ErrorCode.WRONG_THREAD: 500,
    ErrorCode.WRONG_PROCESS: 500,
    ErrorCode.RESOURCE_RELEASE_FAILED: 500,
    ErrorCode.AGENT_REGISTRY_UNAVAILABLE: 500,
    ErrorCode.PROJECTIONS_UNAVAILABLE: 500,
    ErrorCode.SESSION_STORE_UNAVAILABLE: 500,
}


def status_of(code: str) -> int:
    """The HTTP status of a ``SubagentError`` code."""
    return _STATUS.get(code, 400)


def answer_failure(start_response: Start, exc: Exception, request: str) -> list[bytes]:
    """The response to ``request`` (``"GET /path"``, for the log) that raised ``exc``."""
    if isinstance(exc, HttpError):
        return respond(start_response, exc.status, error(exc.code, str(exc)), exc.headers)
    if isinstance(exc, SubagentError):
        status = status_of(exc.code)
        if status < 500:
            return respond(start_response, status, error(exc.code, str(exc)))
        logger.warning("%s failed: %s", request, exc)
        retry = [("Retry-After", str(RETRY_AFTER))] if status == 503 else []
        return respond(start_response, status, error(exc.code, str(exc)), retry)
    logger.error("%s failed unexpectedly", request, exc_info=exc)
    message = "the server failed unexpectedly (it logged why)"
    return respond(start_response, 500, error(ErrorCode.INTERNAL, message))


def _diagnostic(exc: CorruptRecordError) -> dict[str, Any]:
    return {"kind": "corrupt", "detail": str(exc)}


def readable_roots(
    rt: Runtime, ids: Iterable[str]
) -> tuple[list[SessionHeader], list[dict[str, Any]]]:
    """The headers of sessions ``ids`` that exist, by ``(created_at, id)``, and a
    diagnostic (``{"id", "kind", "detail"}``) for each whose header does not decode."""
    headers: list[SessionHeader] = []
    diagnostics: list[dict[str, Any]] = []
    for sid in ids:
        try:
            header = rt.sessions.header(SessionId(sid))
        except CorruptRecordError as exc:
            diagnostics.append({"id": sid, **_diagnostic(exc)})
            continue
        if header is not None:
            headers.append(header)
    headers.sort(key=lambda h: (h.created_at, h.id))
    return headers, diagnostics


def read_session(rt: Runtime, session_id: str, from_seq: int = 0, limit: int = PAGE) -> Encoded:
    """A page of a session, ``{"events", "diagnostics", "next"}``: its events from
    seq ``from_seq`` that decode, a diagnostic (``{"seq", "kind", "detail"}``) for
    each that does not, ``limit`` in all at most -- fewer once they pass
    :data:`PAGE_BYTES` of JSON (one at least) -- and ``next``, the ``from_seq`` of
    the next page (``None``: none is stored yet).

    The writes submitted so far are committed first; the rows are then scanned
    from the store (``store.scan``: a damaged row in its place, the rest still
    read), converted and encoded in gevent's thread pool (``run_blocking``), so a
    long session never holds the hub (a whole log of 20,000 turns held it 5 s)."""
    sid = SessionId(session_id)
    rt.sessions.flush()
    store = rt.store
    if store is None:  # a memory runtime's log is in memory: read whole, paged below
        records: Iterable[Any] = rt.sessions.read(sid, from_seq)
        page: Encoded = rt.backend.run_blocking(_page, lambda: iter(records), limit)
    else:
        page = rt.backend.run_blocking(_page, lambda: store.scan(sid, from_seq), limit)
    return page


def _page(scan: Callable[[], Iterator[Any]], limit: int) -> Encoded:
    """The page of at most ``limit`` records ``scan()`` gives first (see ``read_session``)."""
    events: list[str] = []
    diagnostics: list[str] = []
    size, after = 0, None
    records = scan()
    try:
        for r in records:
            if len(events) + len(diagnostics) >= limit or size >= PAGE_BYTES:
                after = r.seq if type(r.seq) is int else None  # (no int: a damaged file)
                break
            if isinstance(r, CorruptRecordError):
                diagnostics.append(dumps({"seq": r.seq, **_diagnostic(r)}))
                size += len(diagnostics[-1])
            else:
                events.append(dumps({"seq": r.seq, **event_to_wire(r.event)}))
                size += len(events[-1])
    finally:
        close = getattr(records, "close", None)
        if close is not None:
            close()
    body = f'{{"events": [{", ".join(events)}], "diagnostics": [{", ".join(diagnostics)}]'
    return Encoded(f'{body}, "next": {dumps(after)}}}'.encode())
